//! The launchd property list for `conduit daemon run` (a LaunchAgent for a user, a
//! LaunchDaemon for the machine). launchd has no readiness or watchdog protocol: it keeps the
//! job alive and throttles restarts; `conduit ext status` and the logs tell the rest.

use std::fmt::Write;

use super::config::{GENERATED_MARK, LAUNCHD_LABEL, PERMANENT_EXIT_CODE, ServiceConfig};

/// Escape text for a plist `<string>`.
fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The property list's text.
pub fn plist(cfg: &ServiceConfig) -> String {
    let program = xml(&cfg.program.to_string_lossy());
    let state = xml(&cfg.state_dir.to_string_lossy());
    let log = xml(&cfg.state_dir.join("logs/daemon.log").to_string_lossy());
    let env = match &cfg.path_env {
        Some(path) => format!(
            "\t<!-- Extensions get PATH (and HOME, USER, LANG…) and nothing else; this is the PATH of
\t     the shell that installed the job, so they find their interpreters there. -->
\t<key>EnvironmentVariables</key>
\t<dict>
\t\t<key>PATH</key>
\t\t<string>{}</string>
\t</dict>
",
            xml(path)
        ),
        None => String::new(),
    };
    let mut p = String::new();
    let _ = write!(
        p,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- {LAUNCHD_LABEL}: {GENERATED_MARK}.
     `conduit service install` with its force flag rewrites it; `conduit service uninstall`
     removes it. (An XML comment may not hold two hyphens in a row, hence no flag here.) -->
<plist version="1.0">
<dict>
	<key>Label</key>
	<string>{LAUNCHD_LABEL}</string>
	<key>ProgramArguments</key>
	<array>
		<string>{program}</string>
		<string>daemon</string>
		<string>run</string>
		<string>--state-dir</string>
		<string>{state}</string>
	</array>
{env}	<!-- Start at load, and again whenever it exits with a failure (a crash, exit 1). A clean
	     exit (SIGTERM from `launchctl bootout`) is not restarted. Exit {PERMANENT_EXIT_CODE} (the state
	     directory is unusable) is restarted too, throttled: launchd cannot exempt one code. -->
	<key>RunAtLoad</key>
	<true/>
	<key>KeepAlive</key>
	<dict>
		<key>SuccessfulExit</key>
		<false/>
	</dict>
	<!-- At most one start every 10 s. -->
	<key>ThrottleInterval</key>
	<integer>10</integer>
	<!-- A background service: scheduled for throughput, not for a user's foreground app. -->
	<key>ProcessType</key>
	<string>Background</string>
	<!-- SIGTERM, then this long before SIGKILL: longer than the daemon's own worst-case stop. -->
	<key>ExitTimeOut</key>
	<integer>90</integer>
	<!-- The daemon's own log (one event per line, no colours). Extensions' stderr goes to
	     their own logs in the state directory (`conduit ext logs NAME`). -->
	<key>StandardOutPath</key>
	<string>{log}</string>
	<key>StandardErrorPath</key>
	<string>{log}</string>
</dict>
</plist>
"#
    );
    p
}

/// What an installed property list runs: the first `<string>` of `ProgramArguments` and the
/// one after `--state-dir`, unescaped as [`plist`] escapes them.
pub fn program_arguments(text: &str) -> Option<(String, Option<String>)> {
    let start = text.find("<key>ProgramArguments</key>")?;
    let rest = &text[start..];
    let array = &rest[rest.find("<array>")?..rest.find("</array>")?];
    let args: Vec<String> = array
        .split("<string>")
        .skip(1)
        .filter_map(|s| s.split("</string>").next())
        .map(|s| {
            s.replace("&quot;", "\"")
                .replace("&gt;", ">")
                .replace("&lt;", "<")
                .replace("&amp;", "&")
        })
        .collect();
    let program = args.first()?.clone();
    let state = args
        .iter()
        .position(|a| a == "--state-dir")
        .and_then(|i| args.get(i + 1))
        .cloned();
    Some((program, state))
}
