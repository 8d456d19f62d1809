//! The `[budgets]` table: the file's shape and its validation into `budget::Budgets`; and the
//! profiles' `approve` presets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::budget::{Action, Budgets, Limit, Unit, Window};

/// `[budgets]`: `currency`, `[budgets.default]`, `[budgets.principals.NAME]`,
/// `[budgets.profiles.NAME]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetsFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<ScopeFile>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub principals: BTreeMap<String, ScopeFile>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, ScopeFile>,
}

/// The limits of one scope, per window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScopeFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<LimitFile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<LimitFile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub month: Option<LimitFile>,
}

/// `{ tokens = N, cost = X, action = "warn" | "stop" }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    pub action: String,
}

impl BudgetsFile {
    pub fn validate(&self) -> Result<Budgets, ConfigError> {
        let currency = self.currency.clone().unwrap_or_else(|| "USD".to_owned());
        if currency.is_empty() || !currency.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(bad(
                "budgets.currency",
                "must be a currency code such as USD",
            ));
        }
        let scopes = |m: &BTreeMap<String, ScopeFile>, at: &str| {
            m.iter()
                .map(|(name, s)| Ok((name.clone(), s.limits(&format!("budgets.{at}.{name}"))?)))
                .collect::<Result<BTreeMap<_, _>, ConfigError>>()
        };
        Ok(Budgets {
            currency,
            default: match &self.default {
                Some(s) => s.limits("budgets.default")?,
                None => Vec::new(),
            },
            principals: scopes(&self.principals, "principals")?,
            profiles: scopes(&self.profiles, "profiles")?,
        })
    }
}

impl ScopeFile {
    fn limits(&self, at: &str) -> Result<Vec<Limit>, ConfigError> {
        let mut out = Vec::new();
        for (window, l) in [
            (Window::Session, &self.session),
            (Window::Day, &self.day),
            (Window::Month, &self.month),
        ] {
            if let Some(l) = l {
                out.extend(l.limits(window, &format!("{at}.{}", window.name()))?);
            }
        }
        Ok(out)
    }
}

impl LimitFile {
    fn limits(&self, window: Window, at: &str) -> Result<Vec<Limit>, ConfigError> {
        let action = match self.action.as_str() {
            "warn" => Action::Warn,
            "stop" => Action::Stop,
            other => {
                return Err(bad(
                    at,
                    &format!("action {other:?} is neither \"warn\" nor \"stop\""),
                ));
            }
        };
        let mut out = Vec::new();
        if let Some(t) = self.tokens {
            if t == 0 {
                return Err(bad(at, "tokens must be more than 0"));
            }
            out.push(Limit {
                window,
                unit: Unit::Tokens,
                amount: t,
                action,
            });
        }
        if let Some(c) = self.cost {
            if !(c.is_finite() && c > 0.0) {
                return Err(bad(at, "cost must be a number more than 0"));
            }
            let amount = (c * 1e6).round() as u64;
            out.push(Limit {
                window,
                unit: Unit::Cost,
                amount,
                action,
            });
        }
        if out.is_empty() {
            return Err(bad(at, "give tokens, cost or both"));
        }
        Ok(out)
    }
}

fn bad(at: &str, message: &str) -> ConfigError {
    ConfigError::Budget {
        at: at.to_owned(),
        message: message.to_owned(),
    }
}

/// The profiles with `approve = "reads"`: permission requests about read-only tool calls are
/// answered `allow_once` by acpd (journaled as automatic).
/// `agents` is each profile's name and its `approve` key (taken apart by the caller, so this
/// file does not import `settings`, which imports it).
pub(super) fn approve_presets<'a>(
    agents: impl IntoIterator<Item = (&'a String, Option<&'a str>)>,
) -> Result<std::collections::BTreeSet<String>, ConfigError> {
    let mut out = std::collections::BTreeSet::new();
    for (name, approve) in agents {
        match approve {
            None => {}
            Some("reads") => {
                out.insert(name.clone());
            }
            Some(other) => {
                return Err(ConfigError::Agent {
                    name: name.clone(),
                    message: format!("approve {other:?}: the only preset is \"reads\""),
                });
            }
        }
    }
    Ok(out)
}
