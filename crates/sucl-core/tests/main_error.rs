//! What a user sees when `main` returns a sucl error: Rust prints `Error: ` and the error's
//! `Debug`, which must be the sentence. This test has its own `main` (harness = false): it runs
//! itself again as a child whose `main` returns an error, and checks the child's stderr.

use std::process::Command;
use sucl_core::Error;

const CHILD: &str = "SUCL_MAIN_ERROR_TEST_CHILD";

fn main() -> Result<(), Error> {
    if std::env::var_os(CHILD).is_some() {
        return Err(Error::Config("RANK is set but WORLD_SIZE is not".into()));
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let out = Command::new(exe).env(CHILD, "1").output().expect("running the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the child returned an error, so it must exit non-zero");
    assert_eq!(stderr.trim_end(), "Error: config error: RANK is set but WORLD_SIZE is not", "stderr was:\n{stderr}");
    println!("main_error: ok");
    Ok(())
}
