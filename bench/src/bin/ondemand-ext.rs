//! The extension `bench-scale --on-demand` installs a thousand times: one work kind of its own,
//! `k.<its name>` (the name the host gives it in `CONDUIT_EXTENSION`), whose trigger puts every
//! input of a batch into one Work. Nothing else: what is measured is the cost of an extension
//! that is installed but not running, and of starting one when its first event arrives.
//!
//! Run by the daemon (`make bench-scale-on-demand`); it speaks the protocol on stdin and stdout.

use conduit_extension::prelude::*;

fn main() {
    let name = std::env::var("CONDUIT_EXTENSION").unwrap_or_else(|_| "ondemand".to_owned());
    let kind = format!("k.{name}");
    let ext = Extension::new(name, env!("CARGO_PKG_VERSION")).work_kind(
        kind,
        |_cx: Ctx, p: TriggerParams| async move {
            let ids = p.inputs.iter().map(|e| e.id).collect();
            Ok(TriggerResult::new(vec![TriggerGroup::new("all", ids)]))
        },
    );
    std::process::exit(conduit_extension::run(ext));
}
