//! `conduit completions SHELL` and `conduit man --out DIR`: shell completions and man pages,
//! from the same clap tree the binary parses, so they cannot drift from it. Completions are
//! clap_complete's engine, run by this binary at each TAB (so package names complete too); the
//! script only registers it. Man pages are generated from the tree the caller hands in.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::outcome::CliError;

/// Print the completion script for SHELL: subcommands, flags and installed package names.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The script calls this conduit back at each TAB (`COMPLETE=<shell> conduit -- <words>`), so it
completes package names too (`conduit ext status <TAB>`): those installed in the state directory
the line names with --state-dir, else $CONDUIT_STATE_DIR or the default. Load it anew when the
shell starts, so it always matches the binary:

  bash        echo 'source <(conduit completions bash)' >> ~/.bashrc
  zsh         echo 'source <(conduit completions zsh)' >> ~/.zshrc
  fish        echo 'conduit completions fish | source' >> ~/.config/fish/config.fish
  elvish      echo 'eval (conduit completions elvish | slurp)' >> ~/.elvish/rc.elv
  powershell  conduit completions powershell | Out-String | Invoke-Expression")]
pub(crate) struct CompletionsArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

/// Write `conduit.1` and one page per subcommand (`conduit-ext-install.1`, …) into a folder.
#[derive(Debug, clap::Args)]
pub(crate) struct ManArgs {
    /// The folder (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// The registration script clap_complete's engine writes for `COMPLETE=<shell> conduit`,
/// calling this binary by its absolute path (so completion asks the same conduit).
pub(crate) fn completions(args: CompletionsArgs) -> Result<ExitCode, CliError> {
    use clap_complete::env::Shells;
    let name = args.shell.to_string();
    let shells = Shells::builtins();
    let Some(shell) = shells.completer(&name) else {
        return Err(CliError::usage(anyhow::anyhow!(
            "no completion script for {name}; the shells are bash, elvish, fish, powershell and zsh"
        )));
    };
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .context("cannot find the path of this conduit binary")
        .map_err(CliError::failure)?;
    let mut buf = Vec::new();
    shell
        .write_registration(
            "COMPLETE",
            "conduit",
            "conduit",
            &me.to_string_lossy(),
            &mut buf,
        )
        .context("cannot write the completion script")
        .map_err(CliError::failure)?;
    super::outcome::print(&String::from_utf8_lossy(&buf))?;
    Ok(ExitCode::SUCCESS)
}

/// `tree` is the whole command line's clap command.
pub(crate) fn man(args: ManArgs, mut tree: clap::Command) -> Result<ExitCode, CliError> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))
        .map_err(CliError::failure)?;
    tree.build();
    let mut written = 0usize;
    write_pages(&tree, "conduit", &args.out, &mut written).map_err(CliError::failure)?;
    super::outcome::print(&format!(
        "wrote {written} man pages into {} (`man -l {}/conduit.1`)\n",
        args.out.display(),
        args.out.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// One page for `cmd` (named `name`, e.g. `conduit-ext-install`), then its subcommands'.
fn write_pages(
    cmd: &clap::Command,
    name: &str,
    dir: &std::path::Path,
    written: &mut usize,
) -> anyhow::Result<()> {
    // clap names are `&'static str` in this build (no `string` feature); this one-shot command
    // writes a few dozen pages, so the names are leaked.
    let page = cmd
        .clone()
        .name(&*Box::leak(name.to_owned().into_boxed_str()));
    let mut buf = Vec::new();
    clap_mangen::Man::new(page).render(&mut buf)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
    *written += 1;
    // clap's own `help` subcommands get no page: `--help` is on every page.
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}
