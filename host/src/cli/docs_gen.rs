//! `conduit completions SHELL` and `conduit man --out DIR`: shell completions and man pages,
//! generated from the same clap tree the binary parses (the caller hands it in), so they cannot
//! drift from it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use super::outcome::CliError;

/// Print a completion script for SHELL on stdout.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Install it where your shell looks:
  bash  conduit completions bash > ~/.local/share/bash-completion/completions/conduit
  zsh   conduit completions zsh > ~/.zfunc/_conduit   (with fpath+=~/.zfunc before compinit)
  fish  conduit completions fish > ~/.config/fish/completions/conduit.fish")]
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

/// `tree` is the whole command line's clap command.
pub(crate) fn completions(
    args: CompletionsArgs,
    mut tree: clap::Command,
) -> Result<ExitCode, CliError> {
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut tree, "conduit", &mut buf);
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
