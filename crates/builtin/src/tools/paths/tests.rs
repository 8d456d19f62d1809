//! Confinement tests on a real file system: `..`, absolute and dangling symlinks, and a
//! symlink swapped back and forth while files are read and written through it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{HostPath, Roots};
use crate::tools::ToolError;
use crate::tools::beneath::is_escape;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    roots: Roots,
}

/// `root/` (the session's cwd) and `outside/secret.txt` next to it.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::fs::write(root.join("inside.txt"), "inside").unwrap();
    let roots = Roots::new(&root, &[], &dir.path().join("acpd-data"));
    Fixture {
        _dir: dir,
        root,
        outside,
        roots,
    }
}

fn host(f: &Fixture, p: &str) -> HostPath {
    f.roots.for_host(p).expect("lexically inside")
}

fn escapes(r: std::io::Result<impl std::fmt::Debug>) -> bool {
    match r {
        Err(e) => is_escape(&e),
        Ok(v) => panic!("expected EXDEV, got {v:?}"),
    }
}

#[test]
fn acpds_data_directory_is_never_opened_whatever_the_roots() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("token"), "t").unwrap();
    // The parent of the data directory as the cwd: nothing of it is opened on the host.
    let around = Roots::new(dir.path(), &[], &data);
    assert!(around.reach_data_dir());
    assert!(matches!(
        around.for_host("data/token"),
        Err(ToolError::DataDir(_))
    ));
    assert!(matches!(around.for_host("x"), Err(ToolError::Outside(_))));
    // A sibling root is fine, but an absolute path into the data directory is not.
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let beside = Roots::new(&work, &[], &data);
    assert!(!beside.reach_data_dir());
    assert!(beside.for_host("a.txt").is_ok());
    let token = data.join("token");
    assert!(matches!(
        beside.for_host(token.to_str().unwrap()),
        Err(ToolError::DataDir(_))
    ));
}

#[test]
fn dotdot_and_outside_paths_are_refused_lexically() {
    let f = fixture();
    assert!(matches!(
        f.roots.for_host("../outside/secret.txt"),
        Err(ToolError::Outside(_))
    ));
    assert!(matches!(
        f.roots.for_host("a/../../x"),
        Err(ToolError::Outside(_))
    ));
    let abs = f.outside.join("secret.txt");
    assert!(f.roots.for_host(abs.to_str().unwrap()).is_err());
    let p = host(&f, "sub/../inside.txt");
    assert_eq!(p.rel, Path::new("inside.txt"));
    assert_eq!(p.root.read(&p.rel, 100).unwrap(), b"inside");
    assert!(f.roots.for_client("../x").is_err());
    assert!(f.roots.for_client("sub/../y").is_ok());
}

#[test]
fn symlinks_out_are_refused_by_the_kernel() {
    let f = fixture();
    let link = |name: &str, to: &Path| std::os::unix::fs::symlink(to, f.root.join(name)).unwrap();
    link("abs", &f.outside.join("secret.txt"));
    link("rel", Path::new("../outside/secret.txt"));
    link("dir", &f.outside);
    link("ok", Path::new("inside.txt"));
    for name in ["abs", "rel", "dir/secret.txt"] {
        let p = host(&f, name);
        assert!(escapes(p.root.read(&p.rel, 100)), "{name}");
        assert!(escapes(p.root.write(&p.rel, b"x")), "{name}");
        assert!(escapes(p.root.check_write(&p.rel)), "{name}");
    }
    let d = host(&f, "dir");
    assert!(escapes(d.root.list(&d.rel)));
    assert!(escapes(d.root.write(Path::new("dir/new/deeper.txt"), b"x")));
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        "secret"
    );
    assert_eq!(std::fs::read_dir(&f.outside).unwrap().count(), 1);
    // A link that stays inside works, and a write goes to where it points.
    let ok = host(&f, "ok");
    assert_eq!(ok.root.read(&ok.rel, 100).unwrap(), b"inside");
    ok.root.write(&ok.rel, b"rewritten").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.root.join("inside.txt")).unwrap(),
        "rewritten"
    );
    assert!(
        std::fs::symlink_metadata(f.root.join("ok"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn a_dangling_symlink_pointing_outside_is_not_written_through() {
    let f = fixture();
    let target = f.outside.join("created.txt");
    std::os::unix::fs::symlink(&target, f.root.join("dangling")).unwrap();
    std::os::unix::fs::symlink("../outside/created2.txt", f.root.join("dangling2")).unwrap();
    for name in ["dangling", "dangling2"] {
        let p = host(&f, name);
        assert!(escapes(p.root.check_write(&p.rel)), "{name}");
        assert!(escapes(p.root.write(&p.rel, b"pwned")), "{name}");
    }
    assert!(!target.exists() && !f.outside.join("created2.txt").exists());
    // One pointing inside creates its target.
    std::os::unix::fs::symlink("made/here.txt", f.root.join("dangling3")).unwrap();
    let p = host(&f, "dangling3");
    p.root.write(&p.rel, b"made").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.root.join("made/here.txt")).unwrap(),
        "made"
    );
}

#[test]
fn writes_are_atomic_create_directories_and_keep_the_mode() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    let p = host(&f, "a/b/c.txt");
    p.root.write(&p.rel, b"one").unwrap();
    assert_eq!(
        std::fs::read_to_string(f.root.join("a/b/c.txt")).unwrap(),
        "one"
    );
    let file = f.root.join("a/b/c.txt");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o751)).unwrap();
    p.root.write(&p.rel, b"two").unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "two");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o751);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(f.root.join("a/b")).unwrap().collect();
    assert_eq!(names.len(), 1);
    let dir = host(&f, ".");
    assert!(
        dir.root.write(&dir.rel, b"x").is_err(),
        "the root is a directory"
    );
}

/// Flips `root/flip` between a link inside and one outside until `stop`.
fn flipper(
    f: &Fixture,
    inside: &'static str,
    outside: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let link = f.root.join("flip");
    let tmp = f.root.join("flip.tmp");
    std::thread::spawn(move || {
        let mut flips = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let to: &Path = if flips.is_multiple_of(2) {
                Path::new(inside)
            } else {
                &outside
            };
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(to, &tmp).unwrap();
            std::fs::rename(&tmp, &link).unwrap();
            flips += 1;
        }
        flips
    })
}

#[test]
fn a_symlink_swapped_during_reads_and_writes_never_leads_outside() {
    let f = fixture();
    std::fs::create_dir_all(f.root.join("sub")).unwrap();
    std::os::unix::fs::symlink("inside.txt", f.root.join("flip")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flips = flipper(&f, "inside.txt", f.outside.join("secret.txt"), stop.clone());
    let p = host(&f, "flip");
    let (mut inside_reads, mut refused) = (0, 0);
    for i in 0..2000 {
        match p.root.read(&p.rel, 100) {
            Ok(b) => {
                assert_ne!(b, b"secret", "read outside the root");
                inside_reads += 1;
            }
            Err(e) => {
                assert!(
                    is_escape(&e) || e.kind() == std::io::ErrorKind::NotFound,
                    "{e}"
                );
                refused += 1;
            }
        }
        let _ = p.root.write(&p.rel, format!("write {i}").as_bytes());
    }
    stop.store(true, Ordering::Relaxed);
    let flips = flips.join().unwrap();
    assert_eq!(
        std::fs::read_to_string(f.outside.join("secret.txt")).unwrap(),
        "secret"
    );
    assert_eq!(
        std::fs::read_dir(&f.outside).unwrap().count(),
        1,
        "nothing created outside"
    );
    assert!(flips > 10, "the link flipped ({flips} times)");
    assert!(inside_reads + refused == 2000);
}

#[test]
fn a_directory_swapped_for_a_link_during_writes_never_leads_outside() {
    let f = fixture();
    std::fs::create_dir_all(f.root.join("real")).unwrap();
    std::os::unix::fs::symlink("real", f.root.join("flip")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flips = flipper(&f, "real", f.outside.clone(), stop.clone());
    let p = host(&f, "flip/new.txt");
    // 2000 rounds, and on a loaded machine more until one write went through the inside link
    // (so the test is never vacuous: a flipper scheduled just so can refuse every write).
    let landed = || f.root.join("real/new.txt").exists();
    let mut i = 0;
    while i < 2000 || (!landed() && i < 200_000) {
        let _ = p.root.write(&p.rel, format!("write {i}").as_bytes());
        let _ = p.root.list(Path::new("flip"));
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    flips.join().unwrap();
    let outside: Vec<_> = std::fs::read_dir(&f.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["secret.txt"], "nothing created outside");
    assert!(
        f.root.join("real/new.txt").exists(),
        "writes through the inside link landed"
    );
}
