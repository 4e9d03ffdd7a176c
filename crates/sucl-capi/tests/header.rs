//! `include/sucl.h` must be what cbindgen generates from the crate today: a stale header fails
//! here. `SUCL_BLESS=1 cargo test -p sucl-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn checked_in_header_matches_the_generated_one() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("reading cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new().with_crate(dir).with_config(config).generate().expect("cbindgen generates the header").write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = dir.join("include/sucl.h");
    if std::env::var_os("SUCL_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing include/sucl.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/sucl.h is stale: regenerate it with `SUCL_BLESS=1 cargo test -p sucl-capi --test header`\n\
         first differing line: {:?}",
        checked_in.lines().zip(generated.lines()).find(|(a, b)| a != b)
    );
}
