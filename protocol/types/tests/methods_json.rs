//! `extensions/methods.json` is the method table as data, for the tools and SDKs that cannot
//! read Rust (the Python and Node SDKs' tests compare their tables with it). This test fails
//! while the file differs from `conduit_protocol::methods::table_json()`; run it with
//! `UPDATE_EXPECT=1` to write the file afresh.

use std::path::PathBuf;

#[test]
fn methods_json_is_the_table() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../extensions/methods.json");
    let want = conduit_protocol::methods::table_json();
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not the method table; refresh it with \
         `UPDATE_EXPECT=1 cargo test -p conduit-protocol --test methods_json`\n--- expected:\n{want}",
        path.display()
    );
}
