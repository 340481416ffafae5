//! `conduit ext check`: run a package, in any language, through the protocol's rules.
//!
//! The checker plays the host. It starts the package from its manifest and drives it with the
//! same `conduit_rpc::Session` the daemon uses, then breaks the rules on purpose where the
//! protocol says a package must survive that (a garbage line, a 16 MiB + 1 request, a 65th
//! concurrent request). Three instances run, one after another:
//!
//! | instance   | rules |
//! |------------|-------|
//! | `main`     | handshake, capabilities-match-manifest, declared-methods-answer, unknown-method, malformed-line, not-json, batch, request-ids, repeated-members, method-with-result, unknown-members, refusal-order, oversized-line, cancellation, shutdown, shutting-down |
//! | `overload` | overload (holds 64 `check.sleep` calls; a separate instance so that a package that ignores `$/cancel` cannot spoil it, nor it the others) |
//! | `lifecycle`| not-initialized (before its handshake), duplicate-id, stdin-eof (closes its stdin) |
//! | `version`  | version (offers only protocol version 99) |
//!
//! and `stdout-only-protocol` judges every line any of them wrote to stdout.
//!
//! Invariants: every rule ends in bounded time (each wait has a timeout); a rule that cannot
//! run says why (`skip`) instead of failing for another rule's fault — once the main session
//! has ended, the rules after it are skipped, naming the rule during which it ended; no process
//! of the package outlives the check. The report is data ([`Report`]); printing it and the exit
//! code belong to the CLI.

mod callbacks;
mod ctx;
mod dry;
mod instance;
mod readonly;
mod report;
mod rules;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use conduit_rpc::SessionConfig;

use crate::manifest::{Manifest, ManifestError, ResolvedCommand};
use callbacks::CheckHost;
use instance::Instance;

pub use dry::{DryError, DryHandshake, dry_handshake};
pub use report::{CheckOptions, PackageInfo, Report, RuleResult, RunUnder, Status};
pub use rules::RULES;

use ctx::Ctx;

/// Check the package in `dir`. Only an unusable manifest is an error; everything the package
/// does wrong is in the report.
pub async fn check_package(dir: &Path, opts: &CheckOptions) -> Result<Report, ManifestError> {
    let started = Instant::now();
    let manifest = Manifest::load(dir)?;
    let cmd = manifest.resolve_command(dir)?;
    let now_ms = conduit_supervisor::now_ms();
    let source = manifest
        .capabilities
        .ingress
        .first()
        .cloned()
        .unwrap_or_else(|| "check".to_owned());
    // Scratch folders for the package's data and temporary files, gone with the check.
    let scratch = tempfile::Builder::new()
        .prefix("conduit-check-")
        .tempdir()
        .map_err(|e| ManifestError::Read {
            path: std::env::temp_dir(),
            source: e,
            hint: "the check needs a scratch folder in the temporary directory",
        })?;
    let host = CheckHost::new(
        callbacks::synthetic_events(&source, now_ms),
        &scratch.path().join("host"),
    );
    let folders = crate::packages::launch::Folders {
        package: dir.canonicalize().unwrap_or_else(|_| dir.to_owned()),
        data: scratch.path().join("data"),
        tmp: scratch.path().join("tmp"),
    };
    let plan = crate::packages::launch::plan(
        &manifest,
        cmd.program.clone(),
        cmd.args.clone(),
        &folders,
        // As the daemon would once the operator granted the package's declared sandbox paths:
        // the check tests the package under the sandbox it asks for (the asks are reported).
        &crate::packages::settings::PackageSettings {
            grant: true,
            ..Default::default()
        },
    )
    .map_err(|e| ManifestError::Read {
        path: scratch.path().to_owned(),
        source: e,
        hint: "the check needs a scratch folder in the temporary directory",
    })?;
    let ctx = Ctx {
        manifest: &manifest,
        opts,
        host,
        now_ms,
        source,
        launch: plan.launch.clone(),
        sandbox: std::sync::Mutex::new(None),
    };

    let mut results: Vec<RuleResult> = Vec::new();
    let mut instances: Vec<Instance> = Vec::new();
    let mut chosen = None;
    let mut main_ready = false;
    match start(&ctx, &cmd, dir, "main") {
        Err(res) => {
            results.push(res);
            skip_session_rules(
                &mut results,
                "the package could not be started (see `handshake`)",
            );
        }
        Ok(mut main) => {
            let hs = rules::handshake::handshake(&ctx, &mut main).await;
            results.push(hs.result);
            chosen = hs.chosen;
            match &hs.init {
                Some(init) => {
                    main_ready = true;
                    ctx.host.set_capabilities(&init.capabilities);
                    results.push(rules::handshake::capabilities_match(&ctx, init));
                    session_rules(&ctx, &mut main, init, &mut results).await;
                }
                None => skip_session_rules(
                    &mut results,
                    "needs a completed handshake (see `handshake`)",
                ),
            }
            main.finish().await;
            instances.push(main);
            if let Some(init) = &hs.init {
                // Lifecycle first: whether an id in use is refused at all (duplicate-id) decides
                // whether overload judges that refusal's order against the limit, so that a
                // package without the one defect fails one rule, not two.
                let life = lifecycle(&ctx, &cmd, dir, &mut instances).await;
                let ids_refused = life
                    .iter()
                    .any(|r| r.id == rules::DUPLICATE_ID && r.status == Status::Pass);
                results.push(overload(&ctx, &cmd, dir, init, &mut instances, ids_refused).await);
                results.extend(life);
            }
        }
    }
    results.push(version(&ctx, &cmd, dir, chosen, &mut instances).await);
    // Without a handshake on the main instance, the session rules (this one among them) were
    // skipped above.
    if main_ready {
        let (res, inst) = readonly::read_only_restart(&ctx, dir).await;
        results.push(res);
        instances.extend(inst);
    }

    let logs: Vec<(&'static str, Vec<instance::Seen>)> = instances
        .iter()
        .map(|i| (i.label, i.stdout.snapshot()))
        .collect();
    results.push(if instances.is_empty() {
        RuleResult::skip(
            rules::STDOUT_ONLY,
            "no instance of the package could be started",
        )
    } else {
        rules::lines::stdout_only(&logs)
    });

    let mut stderr = BTreeMap::new();
    for inst in &instances {
        let text = inst.stderr.lock().unwrap().text();
        if !text.trim().is_empty() {
            stderr.insert(inst.label.to_owned(), text);
        }
    }
    let order = |id: &str| {
        RULES
            .iter()
            .position(|(r, _)| *r == id)
            .unwrap_or(usize::MAX)
    };
    results.sort_by_key(|r| order(r.id));
    let passed = results.iter().all(|r| r.status != Status::Fail);
    let sandbox = ctx.sandbox.lock().unwrap().clone();
    let mut notes = plan.notes.clone();
    if !manifest.sandbox.is_empty() {
        notes.push(crate::packages::launch::sandbox_ask(
            &manifest.name,
            &manifest,
        ));
    }
    let run_under = RunUnder {
        limits: plan.limits.limits,
        sandbox: sandbox.map(|s| s.summary()),
        notes,
    };
    Ok(Report {
        run_under,
        package: PackageInfo {
            name: manifest.name.clone(),
            version: manifest.version.clone(),
            path: dir.canonicalize().unwrap_or_else(|_| dir.to_owned()),
            protocol: manifest.protocol.clone(),
            command: manifest.command.clone(),
            description: manifest.description.clone(),
        },
        passed,
        rules: results,
        stderr,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// Spawn an instance, or the `handshake` failure that says why it could not start.
fn start(
    ctx: &Ctx<'_>,
    cmd: &ResolvedCommand,
    dir: &Path,
    label: &'static str,
) -> Result<Instance, RuleResult> {
    let config = SessionConfig {
        name: format!("{} ({label})", ctx.manifest.name),
        // More than 64, so the checker can send the 65th concurrent request itself.
        max_outgoing: 2 * conduit_protocol::MAX_CONCURRENT_REQUESTS,
        ..SessionConfig::default()
    };
    let _ = dir;
    let host = ctx.host.for_instance(label);
    let bulk = host.bulk_sink();
    let spawned = Instance::spawn(&ctx.launch, label, host, bulk, config);
    spawned.map(|(inst, sandbox)| {
        ctx.sandbox.lock().unwrap().get_or_insert(sandbox);
        inst
    }).map_err(|e| {
        RuleResult::fail(
            rules::HANDSHAKE,
            format!("could not start `{}`: {e}", cmd.program.display()),
            "make `command` in conduit-extension.toml start the extension: a script needs a `#!` line and the execute bit, a binary must be built for this machine",
        )
    })
}

/// Skip every rule that needs the main session.
fn skip_session_rules(results: &mut Vec<RuleResult>, why: &str) {
    for &(id, _) in RULES {
        if !matches!(id, rules::HANDSHAKE | rules::VERSION | rules::STDOUT_ONLY) {
            results.push(RuleResult::skip(id, why));
        }
    }
}

/// The rules that run one after another on the main session. Once the session has ended, the
/// rest are skipped, naming the rule during which it ended: the author fixes that one first.
async fn session_rules(
    ctx: &Ctx<'_>,
    main: &mut Instance,
    init: &conduit_protocol::InitializeResult,
    results: &mut Vec<RuleResult>,
) {
    use rules::{flow, lines, methods, shapes};
    let mut last = rules::HANDSHAKE;
    for &id in &[
        rules::DECLARED_METHODS,
        rules::UNKNOWN_METHOD,
        rules::MALFORMED_LINE,
        rules::NOT_JSON,
        rules::BATCH,
        rules::REQUEST_IDS,
        rules::REPEATED_MEMBERS,
        rules::METHOD_WITH_RESULT,
        rules::UNKNOWN_MEMBERS,
        rules::REFUSAL_ORDER,
        rules::OVERSIZED_LINE,
        rules::CANCELLATION,
        rules::SHUTDOWN,
    ] {
        if main.session_ended() {
            let state = main.state_note().await;
            let why = format!("the session ended during `{last}` ({state}); fix that rule first");
            results.push(RuleResult::skip(id, why.clone()));
            if id == rules::SHUTDOWN {
                results.push(RuleResult::skip(rules::SHUTTING_DOWN, why));
            }
            continue;
        }
        let res = match id {
            rules::DECLARED_METHODS => methods::declared_methods(ctx, main, init).await,
            rules::UNKNOWN_METHOD => methods::unknown_method(ctx, main).await,
            rules::MALFORMED_LINE => lines::malformed_line(ctx, main).await,
            rules::NOT_JSON => shapes::not_json(ctx, main).await,
            rules::BATCH => shapes::batch(ctx, main).await,
            rules::REQUEST_IDS => shapes::request_ids(ctx, main).await,
            rules::REPEATED_MEMBERS => shapes::repeated_members(ctx, main).await,
            rules::METHOD_WITH_RESULT => shapes::method_with_result(ctx, main).await,
            rules::UNKNOWN_MEMBERS => shapes::unknown_members(ctx, main, init).await,
            rules::REFUSAL_ORDER => shapes::refusal_order(ctx, main, init).await,
            rules::OVERSIZED_LINE => lines::oversized_line(ctx, main).await,
            rules::CANCELLATION => flow::cancellation(ctx, main, init).await,
            rules::SHUTDOWN => {
                let (shutdown, shutting_down) = flow::shutdown(ctx, main).await;
                results.push(shutting_down);
                shutdown
            }
            _ => unreachable!("every id above has a rule"),
        };
        results.push(res);
        last = id;
    }
}

/// The lifecycle rules, on an instance of their own: `not-initialized` before its handshake,
/// then `duplicate-id`, then `stdin-eof`.
async fn lifecycle(
    ctx: &Ctx<'_>,
    cmd: &ResolvedCommand,
    dir: &Path,
    instances: &mut Vec<Instance>,
) -> Vec<RuleResult> {
    let later = [rules::DUPLICATE_ID, rules::STDIN_EOF];
    let mut inst = match start(ctx, cmd, dir, "lifecycle") {
        Ok(inst) => inst,
        Err(res) => {
            let mut out = vec![RuleResult::fail(
                rules::NOT_INITIALIZED,
                format!("a third instance {}", res.detail),
                res.fix.unwrap_or_default(),
            )];
            out.extend(
                later.map(|id| RuleResult::skip(id, "the lifecycle instance could not be started")),
            );
            return out;
        }
    };
    let mut out = vec![rules::lifecycle::not_initialized(ctx, &mut inst).await];
    let hs = if inst.session_ended() {
        None
    } else {
        rules::handshake::handshake(ctx, &mut inst).await.init
    };
    match hs {
        Some(init) => {
            out.push(rules::lifecycle::duplicate_id(ctx, &mut inst, &init).await);
            out.push(if inst.session_ended() {
                let state = inst.state_note().await;
                RuleResult::skip(
                    rules::STDIN_EOF,
                    format!(
                        "the session ended during `duplicate-id` ({state}); fix that rule first"
                    ),
                )
            } else {
                rules::lifecycle::stdin_eof(ctx, &mut inst).await
            });
        }
        None => {
            let why =
                "the lifecycle instance did not complete its handshake after `not-initialized`";
            out.extend(later.map(|id| RuleResult::skip(id, why)));
        }
    }
    inst.finish().await;
    instances.push(inst);
    out
}

/// The overload rule, on an instance of its own.
async fn overload(
    ctx: &Ctx<'_>,
    cmd: &ResolvedCommand,
    dir: &Path,
    init: &conduit_protocol::InitializeResult,
    instances: &mut Vec<Instance>,
    judge_order: bool,
) -> RuleResult {
    if !rules::common::declares_sleep(init) {
        return RuleResult::skip(rules::OVERLOAD, rules::common::NEEDS_SLEEP);
    }
    let mut inst = match start(ctx, cmd, dir, "overload") {
        Ok(inst) => inst,
        Err(res) => {
            return RuleResult::fail(
                rules::OVERLOAD,
                format!("a second instance {}", res.detail),
                res.fix.unwrap_or_default(),
            );
        }
    };
    let hs = rules::handshake::handshake(ctx, &mut inst).await;
    let res = match hs.init {
        Some(_) => rules::flow::overload(ctx, &mut inst, judge_order).await,
        None => RuleResult::fail(
            rules::OVERLOAD,
            format!(
                "a second instance did not complete its handshake: {}",
                hs.result.detail
            ),
            hs.result.fix.unwrap_or_default(),
        ),
    };
    inst.finish().await;
    instances.push(inst);
    res
}

/// The version rule, on an instance of its own.
async fn version(
    ctx: &Ctx<'_>,
    cmd: &ResolvedCommand,
    dir: &Path,
    chosen: Option<u32>,
    instances: &mut Vec<Instance>,
) -> RuleResult {
    let mut inst = match start(ctx, cmd, dir, "version") {
        Ok(inst) => inst,
        Err(_) => {
            return RuleResult::skip(
                rules::VERSION,
                "the package could not be started (see `handshake`)",
            );
        }
    };
    let res = rules::handshake::version(ctx, &mut inst, chosen).await;
    inst.finish().await;
    instances.push(inst);
    res
}
