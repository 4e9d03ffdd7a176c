//! Gives libsucl.so its soname, so that programs linked against it record `libsucl.so.0`
//! (the name the install script installs it under, with `libsucl.so` as a link to it).

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsucl.so.0");
    }
}
