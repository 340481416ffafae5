//! The rules about the handshake: `handshake`, `version` and `capabilities-match-manifest`.
//!
//! Invariant: a handshake counts as completed (and the session rules run) only when the host
//! would accept it: a well-formed `InitializeResult` whose version the host offered.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use conduit_protocol::handshake::VersionMismatchData;
use conduit_protocol::methods::host::INITIALIZE;
use conduit_protocol::{ErrorCode, InitializeParams, InitializeResult, PROTOCOL_VERSIONS};
use conduit_rpc::{CallError, CallOptions};

use super::common::{call_failure, error_text, ms, raw};
use super::ids::{CAPABILITIES_MATCH, HANDSHAKE, VERSION};
use crate::check::ctx::Ctx;
use crate::check::instance::Instance;
use crate::check::report::RuleResult;

/// The version offered by the `version` rule: one no package speaks.
pub(crate) const UNSPOKEN_VERSION: u32 = 99;

const HOST_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the handshake rule found.
#[derive(Debug)]
pub(crate) struct Handshake {
    pub(crate) result: RuleResult,
    /// The answer, when the host would accept it.
    pub(crate) init: Option<InitializeResult>,
    /// The version the package chose, even if the host would refuse it.
    pub(crate) chosen: Option<u32>,
}

fn mismatch_data(e: &conduit_protocol::RpcError) -> Result<VersionMismatchData, String> {
    match &e.data {
        None => Err("it has no `data`".into()),
        Some(d) => serde_json::from_str(d.get()).map_err(|err| {
            format!(
                "its `data` {} is not {{host_versions, extension_versions}}: {err}",
                d.get()
            )
        }),
    }
}

fn as_set(v: &[u32]) -> BTreeSet<u32> {
    v.iter().copied().collect()
}

/// What the daemon sends in `initialize`: this conduit's versions, and the bulk pipe every
/// instance is given (docs/protocol.md §8.1).
fn offer() -> InitializeParams {
    InitializeParams::current(HOST_VERSION).with_bulk()
}

/// `handshake`: answers `initialize` within the timeout with a well-formed result whose
/// `protocol_version` is one the host offered.
pub(crate) async fn handshake(ctx: &Ctx<'_>, inst: &mut Instance) -> Handshake {
    let offered = PROTOCOL_VERSIONS.to_vec();
    let params = offer();
    let t0 = Instant::now();
    let res = inst
        .peer()
        .request(
            INITIALIZE,
            &raw(&params),
            CallOptions::within(Some(ctx.opts.timeout)),
        )
        .await;
    let took = t0.elapsed();
    let failed = |result| Handshake {
        result,
        init: None,
        chosen: None,
    };
    let answer = match res {
        Ok(answer) => answer,
        Err(CallError::Rpc { error, .. }) if error.is(ErrorCode::VersionMismatch) => {
            let theirs = match mismatch_data(&error) {
                Ok(d) => format!("it speaks {:?}", d.extension_versions),
                Err(why) => format!("its error is also malformed: {why}"),
            };
            return failed(RuleResult::fail(
                HANDSHAKE,
                format!(
                    "refused every protocol version this conduit speaks ({offered:?}) with version_mismatch; {theirs}, so the host would mark the package incompatible"
                ),
                format!(
                    "add protocol version {} to the extension (and to `protocol` in conduit-extension.toml), or run it with a conduit that speaks its version",
                    conduit_protocol::PROTOCOL_VERSION
                ),
            ));
        }
        Err(CallError::Rpc { error, .. }) => {
            return failed(RuleResult::fail(
                HANDSHAKE,
                format!("answered `initialize` with {}", error_text(&error)),
                "answer `initialize` with {\"protocol_version\", \"extension\": {\"name\", \"version\"}, \"capabilities\"} (docs/protocol.md §4.2)",
            ));
        }
        Err(e) => {
            let state = inst.state_note().await;
            let fix = if matches!(e, CallError::DeadlineExceeded { .. }) {
                "read requests from stdin, one JSON object per line, answer `initialize` first, and write each answer as one line to stdout, flushed (the package's stderr is below)"
            } else {
                "keep running and answer `initialize`; the package's stderr below says why it stopped"
            };
            return failed(RuleResult::fail(
                HANDSHAKE,
                format!(
                    "asked to `initialize`, the package {}; {state}",
                    call_failure(&e)
                ),
                fix,
            ));
        }
    };
    let init: InitializeResult = match serde_json::from_str(answer.get()) {
        Ok(init) => init,
        Err(e) => {
            return failed(RuleResult::fail(
                HANDSHAKE,
                format!(
                    "answered `initialize` with {}, which is not an InitializeResult: {e}",
                    crate::check::instance::sample(answer.get().as_bytes())
                ),
                "answer {\"protocol_version\": 1, \"extension\": {\"name\": …, \"version\": …}, \"capabilities\": {…}} (docs/protocol.md §4.2)",
            ));
        }
    };
    let chosen = Some(init.protocol_version);
    if !offered.contains(&init.protocol_version) {
        return Handshake {
            result: RuleResult::fail(
                HANDSHAKE,
                format!(
                    "chose protocol version {}, which the host did not offer (it offered {offered:?}); the host would refuse the session",
                    init.protocol_version
                ),
                "choose the newest version present in both the host's `protocol_versions` and your own; when there is none, answer the error version_mismatch (-32003)",
            ),
            init: None,
            chosen,
        };
    }
    if init.extension.name.trim().is_empty() || init.extension.version.trim().is_empty() {
        return Handshake {
            result: RuleResult::fail(
                HANDSHAKE,
                format!(
                    "answered with an empty `extension` name or version ({:?} {:?})",
                    init.extension.name, init.extension.version
                ),
                "answer `extension: {\"name\", \"version\"}` with the package's name and version",
            ),
            init: None,
            chosen,
        };
    }
    let mut notes = Vec::new();
    if init.extension.name != ctx.manifest.name || init.extension.version != ctx.manifest.version {
        notes.push(format!(
            "the extension calls itself {} {}, the manifest {} {}; operators see the manifest's",
            init.extension.name, init.extension.version, ctx.manifest.name, ctx.manifest.version
        ));
    }
    if took > Duration::from_secs(1) {
        notes.push(format!(
            "the handshake took {} ms; the host waits at most 10 s before it counts a failed start",
            ms(took)
        ));
    }
    let result = RuleResult::pass(
        HANDSHAKE,
        format!(
            "answered `initialize` in {} ms: protocol {}, extension {} {}",
            ms(took),
            init.protocol_version,
            init.extension.name,
            init.extension.version
        ),
    )
    .with_notes(notes);
    Handshake {
        result,
        init: Some(init),
        chosen,
    }
}

/// `version`: offered only version 99, the package refuses with `version_mismatch` and both
/// lists; what it says it speaks agrees with the manifest's `protocol`.
pub(crate) async fn version(ctx: &Ctx<'_>, inst: &mut Instance, chosen: Option<u32>) -> RuleResult {
    let offered = vec![UNSPOKEN_VERSION];
    let mut params = offer();
    params.protocol_versions.clone_from(&offered);
    let manifest = &ctx.manifest.protocol;
    let fix_manifest =
        "make `protocol` in conduit-extension.toml list exactly the versions the extension speaks";
    let res = inst
        .peer()
        .request(
            INITIALIZE,
            &raw(&params),
            CallOptions::within(Some(ctx.opts.timeout)),
        )
        .await;
    let fix_refuse = "when no version is in both lists, answer `initialize` with the error version_mismatch (-32003) and data {\"host_versions\": [the host's list], \"extension_versions\": [yours]} (docs/protocol.md §4.3)";
    match res {
        Err(CallError::Rpc { error, .. }) if error.is(ErrorCode::VersionMismatch) => {
            let data = match mismatch_data(&error) {
                Ok(d) => d,
                Err(why) => {
                    return RuleResult::fail(
                        VERSION,
                        format!("answered version_mismatch, but {why}"),
                        fix_refuse,
                    );
                }
            };
            if data.host_versions != offered {
                return RuleResult::fail(
                    VERSION,
                    format!(
                        "answered version_mismatch with data.host_versions {:?}, but the host offered {offered:?}",
                        data.host_versions
                    ),
                    "put the host's `protocol_versions`, as received, in data.host_versions",
                );
            }
            if as_set(&data.extension_versions) != as_set(manifest) {
                return RuleResult::fail(
                    VERSION,
                    format!(
                        "the extension says it speaks {:?} (data.extension_versions), but the manifest's `protocol` is {manifest:?}",
                        data.extension_versions
                    ),
                    fix_manifest,
                );
            }
            if let Some(v) = chosen
                && !manifest.contains(&v)
            {
                return RuleResult::fail(
                    VERSION,
                    format!(
                        "the handshake chose version {v}, which the manifest's `protocol` ({manifest:?}) does not list"
                    ),
                    fix_manifest,
                );
            }
            RuleResult::pass(
                VERSION,
                format!(
                    "refused a host speaking only {offered:?} with version_mismatch; speaks {:?}",
                    data.extension_versions
                ),
            )
        }
        Ok(answer) => {
            let what = serde_json::from_str::<InitializeResult>(answer.get())
                .map(|i| format!("chose protocol version {}", i.protocol_version))
                .unwrap_or_else(|_| "answered with a result".to_owned());
            RuleResult::fail(
                VERSION,
                format!("accepted a host that speaks only version {UNSPOKEN_VERSION}: it {what}"),
                fix_refuse,
            )
        }
        Err(CallError::Rpc { error, .. }) => RuleResult::fail(
            VERSION,
            format!(
                "answered an `initialize` offering only version {UNSPOKEN_VERSION} with {} instead of version_mismatch (-32003)",
                error_text(&error)
            ),
            fix_refuse,
        ),
        Err(e) => {
            let state = inst.state_note().await;
            RuleResult::fail(
                VERSION,
                format!(
                    "offered only version {UNSPOKEN_VERSION}, the package {}; {state}",
                    call_failure(&e)
                ),
                fix_refuse,
            )
        }
    }
}

/// `capabilities-match-manifest`: the handshake declares exactly what the manifest does.
pub(crate) fn capabilities_match(ctx: &Ctx<'_>, init: &InitializeResult) -> RuleResult {
    let hs = &init.capabilities;
    let mf = &ctx.manifest.capabilities;
    let kinds = |c: &conduit_protocol::Capabilities| -> Vec<String> {
        c.work_kinds
            .iter()
            .map(|k| {
                if k.trigger {
                    format!("{} (trigger)", k.name)
                } else {
                    k.name.clone()
                }
            })
            .collect()
    };
    let mut problems = Vec::new();
    let mut total = 0;
    for (what, a, b) in [
        ("work kinds", kinds(hs), kinds(mf)),
        (
            "recurrences",
            hs.recurrences.clone(),
            mf.recurrences.clone(),
        ),
        (
            "dependency filters",
            hs.dependency_filters.clone(),
            mf.dependency_filters.clone(),
        ),
        ("emissions", hs.emissions.clone(), mf.emissions.clone()),
        ("ingress sources", hs.ingress.clone(), mf.ingress.clone()),
        ("methods", hs.methods.clone(), mf.methods.clone()),
    ] {
        let a: BTreeSet<String> = a.into_iter().collect();
        let b: BTreeSet<String> = b.into_iter().collect();
        total += a.len();
        let only_hs: Vec<_> = a.difference(&b).map(|s| format!("`{s}`")).collect();
        let only_mf: Vec<_> = b.difference(&a).map(|s| format!("`{s}`")).collect();
        if !only_hs.is_empty() {
            problems.push(format!(
                "the handshake declares {what} {} that the manifest does not",
                only_hs.join(", ")
            ));
        }
        if !only_mf.is_empty() {
            problems.push(format!(
                "the manifest declares {what} {} that the handshake does not",
                only_mf.join(", ")
            ));
        }
    }
    if problems.is_empty() {
        RuleResult::pass(
            CAPABILITIES_MATCH,
            format!("the handshake and the manifest declare the same {total} capabilities"),
        )
    } else {
        RuleResult::fail(
            CAPABILITIES_MATCH,
            problems.join("; "),
            "make [capabilities] in conduit-extension.toml list exactly what the extension declares in its `initialize` answer: the host calls what the handshake declares, operators read the manifest",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::callbacks::CheckHost;
    use crate::check::{CheckOptions, Status};
    use crate::manifest::Manifest;
    use conduit_protocol::Capabilities;
    use conduit_protocol::handshake::{Software, WorkKind};

    fn init(caps: Capabilities) -> InitializeResult {
        InitializeResult::new(1, Software::new("notes", "0.1.0"), caps)
    }

    #[test]
    fn capabilities_must_match_the_manifest_in_any_order() {
        let manifest = Manifest::parse(
            "name = \"notes\"\nversion = \"0.1.0\"\nprotocol = 1\ncommand = [\"./x\"]\n\
             [capabilities]\nwork_kinds = [{ name = \"note\", trigger = true }]\nmethods = [\"echo\", \"check.sleep\"]\n",
            std::path::Path::new("conduit-extension.toml"),
        )
        .unwrap();
        let opts = CheckOptions::default();
        let ctx = Ctx {
            manifest: &manifest,
            opts: &opts,
            // No artifact is made here, so its folder is never created.
            host: CheckHost::new(vec![], std::path::Path::new("unused")),
            now_ms: 0,
            source: "check".into(),
            launch: crate::check::ctx::test_launch(),
            sandbox: std::sync::Mutex::new(None),
        };
        let mut same = Capabilities::default();
        same.work_kinds = vec![WorkKind::new("note", true)];
        same.methods = vec!["check.sleep".into(), "echo".into()];
        assert_eq!(
            capabilities_match(&ctx, &init(same.clone())).status,
            Status::Pass
        );

        let mut differs = same;
        differs.work_kinds[0].trigger = false;
        differs.methods.pop();
        differs.recurrences.push("digest".into());
        let res = capabilities_match(&ctx, &init(differs));
        assert_eq!(res.status, Status::Fail);
        for want in [
            "the handshake declares work kinds `note` that the manifest does not",
            "the manifest declares work kinds `note (trigger)` that the handshake does not",
            "the handshake declares recurrences `digest` that the manifest does not",
            "the manifest declares methods `echo` that the handshake does not",
        ] {
            assert!(res.detail.contains(want), "{want:?} in {}", res.detail);
        }
        assert!(
            res.fix
                .unwrap()
                .contains("[capabilities] in conduit-extension.toml")
        );
    }
}
