//! `acpd usage`: what turns spent, per day, principal and profile, from the store's rollups.
//! A turn whose agent reported nothing is counted as unknown, and its tokens print as `?`.

use std::collections::HashMap;

use acpd_store::{Store, UsageQuery, UsageRollup};

/// `acpd usage` options.
#[derive(clap::Args)]
pub(super) struct UsageArgs {
    /// Only this principal (token name).
    #[arg(long)]
    principal: Option<String>,
    /// Only turns from this UTC day on (YYYY-MM-DD).
    #[arg(long, value_parser = parse_day)]
    since: Option<String>,
    /// Only this session's turns.
    #[arg(long)]
    session: Option<String>,
    #[command(flatten)]
    pub args: crate::config::Args,
}

fn parse_day(s: &str) -> Result<String, String> {
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(|d| d.format("%Y-%m-%d").to_string())
        .map_err(|_| format!("{s:?} is not a date (YYYY-MM-DD)"))
}

/// The table, for `cli.rs` to print.
pub(super) async fn run(u: UsageArgs, store: &Store) -> Result<String, String> {
    let principal_id = match &u.principal {
        None => None,
        Some(name) => match store.principal_by_name(name).await {
            Ok(Some(p)) => Some(p.id),
            Ok(None) => return Err(format!("no principal named {name:?}")),
            Err(e) => return Err(e.to_string()),
        },
    };
    let q = UsageQuery {
        principal_id,
        since_day: u.since,
        session_id: u.session,
    };
    let rows = store.usage_rollup(&q).await.map_err(|e| e.to_string())?;
    let mut names: HashMap<String, String> = HashMap::new();
    for r in &rows {
        if !names.contains_key(&r.principal_id) {
            let name = match store.principal(&r.principal_id).await {
                Ok(Some(p)) => p.name,
                _ => r.principal_id.clone(),
            };
            names.insert(r.principal_id.clone(), name);
        }
    }
    let mut out = "day\tprincipal\tprofile\tturns\tunknown\tinput\toutput\tcached\tthought\tcost\n"
        .to_owned();
    for (r, costs) in merged(rows) {
        let name = names.get(&r.principal_id).unwrap_or(&r.principal_id);
        out.push_str(&line(&r, name, &costs));
        out.push('\n');
    }
    Ok(out)
}

/// The store's rows are per currency too: one line per day, principal and profile here,
/// with the cost in each currency.
fn merged(rows: Vec<UsageRollup>) -> Vec<(UsageRollup, Vec<String>)> {
    let mut out: Vec<(UsageRollup, Vec<String>)> = Vec::new();
    let sum = |a: Option<i64>, b: Option<i64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    for r in rows {
        let cost = match (r.cost_micros, &r.currency) {
            (Some(c), Some(cur)) => Some(format!("{:.6} {cur}", c as f64 / 1e6)),
            _ => None,
        };
        let same = |m: &UsageRollup| {
            (&m.day, &m.principal_id, &m.profile) == (&r.day, &r.principal_id, &r.profile)
        };
        match out.iter_mut().find(|(m, _)| same(m)) {
            Some((m, costs)) => {
                m.turns += r.turns;
                m.unknown_turns += r.unknown_turns;
                m.input_tokens = sum(m.input_tokens, r.input_tokens);
                m.output_tokens = sum(m.output_tokens, r.output_tokens);
                m.cached_tokens = sum(m.cached_tokens, r.cached_tokens);
                m.thought_tokens = sum(m.thought_tokens, r.thought_tokens);
                costs.extend(cost);
            }
            None => out.push((r, cost.into_iter().collect())),
        }
    }
    out
}

/// One row of the table: tab-separated, `?` where no turn reported a figure.
fn line(r: &UsageRollup, principal: &str, costs: &[String]) -> String {
    let n = |v: Option<i64>| v.map_or("?".to_owned(), |v| v.to_string());
    let cost = if costs.is_empty() {
        "?".to_owned()
    } else {
        costs.join(" + ")
    };
    format!(
        "{}\t{principal}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{cost}",
        r.day,
        r.profile,
        r.turns,
        r.unknown_turns,
        n(r.input_tokens),
        n(r.output_tokens),
        n(r.cached_tokens),
        n(r.thought_tokens),
    )
}
