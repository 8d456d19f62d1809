//! The one integration-test binary: real sockets, a real daemon, a real store.
//!
//! `scripted_agent` tests the stand-in agent alone; every other module drives `acpd` end to
//! end (see `support/daemon.rs` for the store choice: `ACPD_TEST_E2E_STORE=postgres`).

#[allow(dead_code)]
mod pgtest;
mod support;

mod agent_backoff;
mod agent_calls;
mod agent_processes;
mod agent_stdin;
mod agent_supervision;
mod attach_after;
mod bad_input;
mod builtin;
mod builtin_provider;
mod builtin_support;
mod builtin_tools;
mod cancel;
mod child_env;
mod client_requests;
mod config;
mod data_dir;
mod durability;
mod editor_mcp;
mod editor_paths;
mod fork;
mod fs_roots;
mod grants;
mod handshake;
mod hostile;
mod journal_form;
mod journal_rejection;
mod journal_retention;
mod layering;
mod limits;
mod listener_starvation;
mod load_resume;
mod logging;
mod mcp_hosted;
mod mcp_policy;
mod metrics_at_start;
mod new_session;
mod notification_flood;
mod operations;
mod profiles;
mod prompt_turn;
mod python_sdk;
mod replicas;
mod request_order;
mod revocation;
mod scripted_agent;
mod security;
mod session_limit;
mod session_list;
mod shared_sessions;
mod shim;
mod shim_input;
mod shim_support;
mod slowloris;
mod start_log;
mod store;
mod store_failures;
mod streamable_http;
mod streamable_http_flow;
mod streamable_http_h2;
mod streamable_http_requests;
mod streamable_http_resume;
mod streamable_http_sessions;
mod tcp_gate;
mod tidy;
mod transport_flow;
mod transports;
mod update_path;
mod web_console;
mod wire_edges;
