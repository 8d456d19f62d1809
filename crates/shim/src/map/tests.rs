//! The rewriter on every message kind that carries a path, both ways, and on what it must
//! leave alone.

use serde_json::{Value, json};

use super::{Dir, MapError, PathMap};

fn map() -> PathMap {
    PathMap::new(&[
        "/Users/me/src/app=/home/me/app",
        "/Users/me/src/app/vendor=/srv/vendor",
        "/Users/me/My Files=/data/my files",
    ])
    .unwrap()
}

fn to_remote(m: &mut PathMap, v: Value) -> Value {
    match m.editor_to_daemon(&v.to_string()) {
        Some(s) => serde_json::from_str(&s).unwrap(),
        None => v,
    }
}

fn to_local(m: &mut PathMap, v: Value) -> Value {
    match m.daemon_to_editor(&v.to_string()) {
        Some(s) => serde_json::from_str(&s).unwrap(),
        None => v,
    }
}

#[test]
fn longest_prefix_wins_component_wise() {
    let m = map();
    let r = |p| m.path(Dir::ToRemote, p);
    assert_eq!(r("/Users/me/src/app").as_deref(), Some("/home/me/app"));
    assert_eq!(
        r("/Users/me/src/app/a.rs").as_deref(),
        Some("/home/me/app/a.rs")
    );
    assert_eq!(
        r("/Users/me/src/app/vendor/x").as_deref(),
        Some("/srv/vendor/x")
    );
    assert_eq!(r("/Users/me/src/application"), None);
    assert_eq!(r("/Users/me/src"), None);
    assert_eq!(r("relative/path"), None);
    let l = |p| m.path(Dir::ToLocal, p);
    assert_eq!(
        l("/srv/vendor/y").as_deref(),
        Some("/Users/me/src/app/vendor/y")
    );
    assert_eq!(l("/home/me/app2"), None);
    assert_eq!(l("/etc/hosts"), None);
}

#[test]
fn specs_are_checked_and_normalized() {
    assert!(matches!(PathMap::new(&["/a"]), Err(MapError::Syntax(_))));
    assert!(matches!(
        PathMap::new(&["a=/b"]),
        Err(MapError::Path { side: "LOCAL", .. })
    ));
    assert!(matches!(
        PathMap::new(&["/a=/b/../c"]),
        Err(MapError::Path { side: "REMOTE", .. })
    ));
    assert!(matches!(
        PathMap::new(&["/a=/b", "/a/=/c"]),
        Err(MapError::Conflict(_))
    ));
    let m = PathMap::new(&["/a//b/=/c/"]).unwrap();
    assert_eq!(m.path(Dir::ToRemote, "/a/b/x").as_deref(), Some("/c/x"));
    let root = PathMap::new(&["/=/mnt/laptop"]).unwrap();
    assert_eq!(
        root.path(Dir::ToRemote, "/etc").as_deref(),
        Some("/mnt/laptop/etc")
    );
    assert_eq!(root.path(Dir::ToLocal, "/mnt/laptop").as_deref(), Some("/"));
    assert_eq!(
        root.uri(Dir::ToLocal, "file:///mnt/laptop").as_deref(),
        Some("file:///")
    );
}

#[test]
fn file_uris_keep_their_spelling_past_the_prefix() {
    let m = map();
    assert_eq!(
        m.uri(Dir::ToRemote, "file:///Users/me/src/app/a%20b.rs#L3")
            .as_deref(),
        Some("file:///home/me/app/a%20b.rs#L3")
    );
    assert_eq!(
        m.uri(Dir::ToRemote, "file:///Users/me/My%20Files/n.txt")
            .as_deref(),
        Some("file:///data/my%20files/n.txt")
    );
    assert_eq!(
        m.uri(Dir::ToLocal, "file://localhost/data/my%20files")
            .as_deref(),
        Some("file://localhost/Users/me/My%20Files")
    );
    assert_eq!(m.uri(Dir::ToRemote, "file://host/Users/me/src/app"), None);
    assert_eq!(m.uri(Dir::ToRemote, "https://x/Users/me/src/app"), None);
    assert_eq!(m.uri(Dir::ToRemote, "file:///Users/me/src/apps"), None);
}

#[test]
fn session_setup_and_list_filter_go_remote() {
    let mut m = map();
    for method in [
        "session/new",
        "session/load",
        "session/resume",
        "session/fork",
    ] {
        let v = to_remote(
            &mut m,
            json!({"jsonrpc":"2.0","id":1,"method":method,"params":{
                "sessionId":"s","cwd":"/Users/me/src/app",
                "additionalDirectories":["/Users/me/src/app/vendor","/opt/x"],"mcpServers":[]}}),
        );
        assert_eq!(v["params"]["cwd"], "/home/me/app", "{method}");
        assert_eq!(
            v["params"]["additionalDirectories"],
            json!(["/srv/vendor", "/opt/x"])
        );
    }
    let v = to_remote(
        &mut m,
        json!({"jsonrpc":"2.0","id":7,"method":"session/list","params":{"cwd":"/Users/me/src/app"}}),
    );
    assert_eq!(v["params"]["cwd"], "/home/me/app");
    // Its answer comes back local; another answer with the same shape does not.
    let answer = json!({"jsonrpc":"2.0","id":7,"result":{"sessions":[
        {"sessionId":"s","cwd":"/home/me/app","additionalDirectories":["/srv/vendor"]},
        {"sessionId":"t","cwd":"/elsewhere"}]}});
    let v = to_local(&mut m, answer.clone());
    assert_eq!(v["result"]["sessions"][0]["cwd"], "/Users/me/src/app");
    assert_eq!(
        v["result"]["sessions"][0]["additionalDirectories"],
        json!(["/Users/me/src/app/vendor"])
    );
    assert_eq!(v["result"]["sessions"][1]["cwd"], "/elsewhere");
    assert_eq!(to_local(&mut m, answer.clone()), answer);
}

#[test]
fn a_list_with_nothing_mapped_is_forgotten() {
    let mut m = map();
    assert_eq!(
        m.editor_to_daemon(r#"{"jsonrpc":"2.0","id":"l","method":"session/list","params":{}}"#),
        None
    );
    assert_eq!(
        m.daemon_to_editor(r#"{"jsonrpc":"2.0","id":"l","result":{"sessions":[]}}"#),
        None
    );
    assert!(m.lists.is_empty());
}

#[test]
fn prompt_links_go_remote() {
    let mut m = map();
    let v = to_remote(
        &mut m,
        json!({"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{"sessionId":"s","prompt":[
            {"type":"text","text":"see /Users/me/src/app/a.rs"},
            {"type":"resource_link","name":"a.rs","uri":"file:///Users/me/src/app/a.rs"},
            {"type":"resource","resource":{"uri":"file:///Users/me/src/app/b.rs","text":"x"}}]}}),
    );
    let p = &v["params"]["prompt"];
    assert_eq!(
        p[0]["text"], "see /Users/me/src/app/a.rs",
        "prose is not a path"
    );
    assert_eq!(p[1]["uri"], "file:///home/me/app/a.rs");
    assert_eq!(p[2]["resource"]["uri"], "file:///home/me/app/b.rs");
}

#[test]
fn tool_calls_and_chunks_come_back_local() {
    let mut m = map();
    for kind in ["tool_call", "tool_call_update"] {
        let v = to_local(
            &mut m,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{
                "sessionUpdate":kind,"toolCallId":"t","title":"edit /home/me/app/a.rs",
                "locations":[{"path":"/home/me/app/a.rs","line":3},{"path":"/etc/hosts"}],
                "content":[
                    {"type":"diff","path":"/srv/vendor/v.rs","oldText":null,"newText":"x"},
                    {"type":"content","content":{"type":"resource_link","name":"a","uri":"file:///home/me/app/a.rs"}},
                    {"type":"terminal","terminalId":"/home/me/app"}]}}}),
        );
        let u = &v["params"]["update"];
        assert_eq!(u["title"], "edit /home/me/app/a.rs");
        assert_eq!(
            u["locations"][0],
            json!({"path":"/Users/me/src/app/a.rs","line":3})
        );
        assert_eq!(u["locations"][1]["path"], "/etc/hosts");
        assert_eq!(u["content"][0]["path"], "/Users/me/src/app/vendor/v.rs");
        assert_eq!(
            u["content"][1]["content"]["uri"],
            "file:///Users/me/src/app/a.rs"
        );
        assert_eq!(u["content"][2]["terminalId"], "/home/me/app");
    }
    for kind in [
        "agent_message_chunk",
        "user_message_chunk",
        "agent_thought_chunk",
    ] {
        let v = to_local(
            &mut m,
            json!({"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{
                "sessionUpdate":kind,"content":{"type":"resource_link","name":"a","uri":"file:///home/me/app/a.rs"}}}}),
        );
        assert_eq!(
            v["params"]["update"]["content"]["uri"],
            "file:///Users/me/src/app/a.rs"
        );
    }
}

#[test]
fn client_requests_come_back_local() {
    let mut m = map();
    for (method, key) in [
        ("fs/read_text_file", "path"),
        ("fs/write_text_file", "path"),
        ("terminal/create", "cwd"),
    ] {
        let v = to_local(
            &mut m,
            json!({"jsonrpc":"2.0","id":5,"method":method,"params":{"sessionId":"s",key:"/home/me/app/x"}}),
        );
        assert_eq!(v["params"][key], "/Users/me/src/app/x", "{method}");
    }
    let v = to_local(
        &mut m,
        json!({"jsonrpc":"2.0","id":6,"method":"session/request_permission","params":{"sessionId":"s",
            "toolCall":{"toolCallId":"t","locations":[{"path":"/home/me/app/x"}]},"options":[]}}),
    );
    assert_eq!(
        v["params"]["toolCall"]["locations"][0]["path"],
        "/Users/me/src/app/x"
    );
}

#[test]
fn messages_without_a_mapped_prefix_are_not_parsed() {
    let mut m = map();
    // Not JSON at all: were it parsed, it would be refused; it is passed over untouched.
    assert_eq!(m.daemon_to_editor("not json, /elsewhere"), None);
    assert_eq!(m.editor_to_daemon("not json either"), None);
    // A mapped prefix in prose is parsed, found to be no path, and relayed as it came.
    let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"/home/me/app"}}}}"#;
    assert_eq!(m.daemon_to_editor(chunk), None);
    // Without mappings nothing is looked at.
    let mut none = PathMap::new::<&str>(&[]).unwrap();
    assert!(none.pairs.is_empty());
    assert_eq!(none.daemon_to_editor(chunk), None);
}

#[test]
fn a_prefix_an_encoder_may_spell_otherwise_makes_every_message_a_candidate() {
    let mut m = PathMap::new(&["/Ünï/x=/u"]).unwrap();
    assert!(m.to_remote.always);
    // JSON may escape non-ASCII; the walk still finds it.
    let line =
        r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/\u00dcn\u00ef/x/y"}}"#;
    let v: Value = serde_json::from_str(&m.editor_to_daemon(line).unwrap()).unwrap();
    assert_eq!(v["params"]["cwd"], "/u/y");
}

/// Not a speed assertion: prints what the needle check saves on streamed chunks
/// (`cargo test -p acp-shim map::tests::measure -- --ignored --nocapture`).
#[test]
#[ignore]
fn measure_chunk_fast_path() {
    let mut m = map();
    let chunk = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess_0123456789","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore"}},"_meta":{"acpd":{"seq":12345}}}}"#;
    let n = 200_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        assert!(m.daemon_to_editor(chunk).is_none());
    }
    let fast = t.elapsed();
    let t = std::time::Instant::now();
    for _ in 0..n {
        let mut v: Value = serde_json::from_str(chunk).unwrap();
        assert!(!m.message(Dir::ToLocal, &mut v));
    }
    let full = t.elapsed();
    eprintln!(
        "per chunk: needle check {:?}, full parse and walk {:?}",
        fast / n,
        full / n
    );
}
