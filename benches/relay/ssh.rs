//! The ssh paths (issue 45): what a remote user runs instead of acpd — Zed's remote
//! development starts the agent over `ssh -T`, with ControlMaster keeping a connection warm.
//! A private sshd on loopback with its own host key, authorized key and config in a temp dir,
//! on an unprivileged high port; an `ssh -T` client per connection (a full handshake each),
//! or a mux client of a master connection started once (`-M -S`, what ControlMaster does).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::procs::{self, Mode};

/// Where sshd and ssh are (bench/run.sh installs openssh-server when sshd is missing).
pub const SSHD: &str = "/usr/sbin/sshd";

/// sshd on 127.0.0.1 and the master connection to it, both stopped when dropped.
pub struct Sshd {
    dir: PathBuf,
    port: u16,
    sshd: Child,
    /// None only while `start` brings it up.
    master: Option<Child>,
}

fn keygen(path: &Path) -> Result<()> {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "acpd-bench", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .context("running ssh-keygen")?;
    ensure!(st.success(), "ssh-keygen failed: {st}");
    Ok(())
}

impl Sshd {
    /// sshd in `dir` (created), pinned like `mode` (its per-connection children and the agents
    /// they start inherit that), and a warm master connection to it.
    pub fn start(mode: Mode, dir: &Path) -> Result<Sshd> {
        ensure!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: apt-get install openssh-server (bench/run.sh does)"
        );
        std::fs::create_dir_all(dir)?;
        let host_key = dir.join("host_key");
        let client_key = dir.join("client_key");
        keygen(&host_key)?;
        keygen(&client_key)?;
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys"))?;
        let port = procs::free_port()?;
        let host_pub = std::fs::read_to_string(dir.join("host_key.pub"))?;
        let mut words = host_pub.split_whitespace();
        let (Some(kind), Some(key)) = (words.next(), words.next()) else {
            bail!("odd host key: {host_pub}");
        };
        std::fs::write(
            dir.join("known_hosts"),
            format!("[127.0.0.1]:{port} {kind} {key}\n"),
        )?;
        let d = dir.display();
        // No PAM, no password, the key files in a temp dir (StrictModes would refuse /tmp's
        // modes); run as the bench's user. MaxSessions: the master carries every mux session.
        std::fs::write(
            dir.join("sshd_config"),
            format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {d}/host_key\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPidFile none\nUsePAM no\n\
                 StrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nMaxSessions 1000\nMaxStartups 100\n\
                 LogLevel ERROR\nSubsystem sftp none\n"
            ),
        )?;
        // As root, sshd 9.x wants its privilege-separation directory.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::create_dir_all("/run/sshd")?;
        }
        let log = std::fs::File::create(dir.join("sshd.log"))?;
        let mut sshd = mode
            .command(SSHD)
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting sshd")?;
        procs::wait_port(port, &mut sshd, "sshd")?;
        let mut s = Sshd {
            dir: dir.to_owned(),
            port,
            sshd,
            master: None,
        };
        let ctl = s.control_path();
        let mut master = s.base(mode);
        master
            .args(["-M", "-S"])
            .arg(&ctl)
            .args(["-o", "ControlPersist=no", "-N", "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("master.log"))?);
        let m = s
            .master
            .insert(master.spawn().context("starting the ssh master")?);
        // The control socket appears once the master has logged in.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ctl.exists() {
            if let Some(st) = m.try_wait()? {
                bail!(
                    "the ssh master exited: {st}; {}",
                    std::fs::read_to_string(dir.join("master.log")).unwrap_or_default()
                );
            }
            ensure!(Instant::now() < deadline, "no ssh master within 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(s)
    }

    fn control_path(&self) -> PathBuf {
        self.dir.join("ctl")
    }

    /// `ssh` with this sshd's key, port and known host, no user config, never a prompt.
    fn base(&self, mode: Mode) -> Command {
        let mut cmd = mode.command("ssh");
        cmd.args(["-F", "/dev/null", "-i"])
            .arg(self.dir.join("client_key"))
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                self.dir.join("known_hosts").display()
            ))
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
            .args(["-p", &self.port.to_string()]);
        cmd
    }

    /// `ssh -T 127.0.0.1 agent`: a connection of its own, or (`mux`) a session on the warm
    /// master. The remote command runs in the user's shell, as with any ssh; the scripted
    /// agent is told to be quiet there (sshd passes no environment).
    pub fn client(&self, mode: Mode, agent: &Path, mux: bool) -> Command {
        let mut cmd = self.base(mode);
        cmd.arg("-T");
        if mux {
            cmd.arg("-S")
                .arg(self.control_path())
                .args(["-o", "ControlMaster=no"]);
        }
        cmd.arg("127.0.0.1").arg(format!(
            "ACPD_SCRIPTED_AGENT_QUIET=1 exec {}",
            agent.display()
        ));
        cmd
    }

    /// OpenSSH's version (`ssh -V` prints it on stderr).
    pub fn version() -> String {
        Command::new("ssh")
            .arg("-V")
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned()
            })
            .unwrap_or_default()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        if let Some(m) = &mut self.master {
            procs::stop(m, Duration::from_secs(5));
        }
        procs::stop(&mut self.sshd, Duration::from_secs(5));
    }
}
