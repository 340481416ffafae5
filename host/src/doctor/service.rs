//! The service check: is a service file installed, written by `conduit service install`, and
//! does it run this binary (not one in a build folder) on this state directory? Read with the
//! generators' own readers (`service::installed_command`), so what is checked is what
//! `conduit service install` writes.

use std::path::{Path, PathBuf};

use super::options::Options;
use super::report::Check;
use super::text::sh;
use crate::service::{self, GENERATED_MARK, Manager, Scope};

/// What the installed service file says.
#[derive(Clone, Debug)]
pub(super) struct Installed {
    pub(super) path: PathBuf,
    /// Written by `conduit service install` (else it is someone's own and not judged).
    pub(super) generated: bool,
    pub(super) program: Option<PathBuf>,
    pub(super) state_dir: Option<PathBuf>,
    /// The unit hands the daemon a cgroup of its own (`Delegate=yes`).
    pub(super) delegates: bool,
}

/// The installed service file, if there is one.
pub(super) fn read(o: &Options) -> Option<Installed> {
    let path = o.service_file.clone()?;
    let text = std::fs::read_to_string(&path).ok()?;
    let (program, state_dir) = service::installed_command(o.manager, &text).unzip();
    Some(Installed {
        generated: text.contains(GENERATED_MARK),
        program: program.map(PathBuf::from),
        state_dir: state_dir.flatten().map(PathBuf::from),
        delegates: o.manager == Manager::Systemd
            && text.lines().any(|l| l.trim() == "Delegate=yes"),
        path,
    })
}

/// `conduit service install`, with `--system` for the machine's manager.
fn install_command(o: &Options, force: bool) -> String {
    let mut cmd = String::from("conduit");
    if o.state_dir.source != crate::state_dir::StateDirSource::PlatformDefault {
        cmd.push_str(&format!(" --state-dir {}", sh(&o.state_dir.path)));
    }
    cmd.push_str(" service install");
    if o.scope == Scope::System {
        cmd.push_str(" --system");
    }
    if force {
        cmd.push_str(" --force");
    }
    cmd
}

pub(super) fn check(o: &Options, installed: Option<&Installed>) -> Check {
    const NAME: &str = "service";
    let Some(file) = &o.service_file else {
        return Check::warn(
            NAME,
            "no home folder ($HOME is not set), so no user service to look for",
            "HOME=/home/YOU conduit doctor",
        );
    };
    let Some(unit) = installed else {
        return Check::warn(
            NAME,
            format!(
                "no service file at {}: the daemon runs only while someone keeps `conduit daemon run` going",
                file.display()
            ),
            install_command(o, false),
        );
    };
    if !unit.generated {
        return Check::ok(
            NAME,
            format!(
                "{} was not written by `conduit service install`: not judged",
                unit.path.display()
            ),
        );
    }
    let Some(program) = &unit.program else {
        return Check::fail(
            NAME,
            format!("{} names no program to run", unit.path.display()),
            install_command(o, true),
        );
    };
    if !program.is_file() {
        return Check::fail(
            NAME,
            format!(
                "{} runs {}, which does not exist: the service cannot start",
                unit.path.display(),
                program.display()
            ),
            install_command(o, true),
        );
    }
    if let Some(target) = service::build_folder(program, Path::is_file) {
        return Check::warn(
            NAME,
            format!(
                "{} runs {}, inside the build folder {}: the next build or `cargo clean` changes or removes what the service runs",
                unit.path.display(),
                program.display(),
                target.display()
            ),
            "cargo install --path host --root ~/.local && ~/.local/bin/conduit service install --force",
        );
    }
    let this = o.program.as_deref();
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
    let same = |a: &Path, b: &Path| canon(a) == canon(b);
    let ours_is_a_build = this.is_some_and(|p| service::build_folder(p, Path::is_file).is_some());
    if let Some(this) = this
        && !same(program, this)
        && !ours_is_a_build
    {
        return Check::warn(
            NAME,
            format!(
                "{} runs {}, not this conduit ({})",
                unit.path.display(),
                program.display(),
                this.display()
            ),
            install_command(o, true),
        );
    }
    let ours = std::path::absolute(&o.state_dir.path).unwrap_or(o.state_dir.path.clone());
    if let Some(theirs) = &unit.state_dir
        && theirs != &ours
    {
        return Check::warn(
            NAME,
            format!(
                "{} runs the daemon on {}, not on {}",
                unit.path.display(),
                theirs.display(),
                ours.display()
            ),
            install_command(o, true),
        );
    }
    Check::ok(
        NAME,
        format!(
            "{} runs {} on {}",
            unit.path.display(),
            program.display(),
            ours.display()
        ),
    )
}
