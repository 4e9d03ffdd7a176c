//! Generates the export table from `api/nccl-api.txt` (one table for every name the library
//! exports) and gives the library NCCL's SONAME.

use std::fmt::Write as _;

fn main() {
    println!("cargo:rerun-if-changed=api/nccl-api.txt");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    let table = std::fs::read_to_string("api/nccl-api.txt").expect("api/nccl-api.txt");
    let mut names = String::new();
    let mut kinds = String::new();
    let mut idx = String::new();
    let mut tramps = String::new();
    let mut n = 0;
    for line in table.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(cols.len() == 5, "api/nccl-api.txt: want 5 columns: {line}");
        let (name, ret, mode) = (cols[0], cols[1], cols[3]);
        let kind = match ret {
            "result" => "Result",
            "string" => "Str",
            "void" => "Void",
            "int" => "Int",
            "team" => "Team",
            other => panic!("api/nccl-api.txt: unknown return kind {other} for {name}"),
        };
        writeln!(names, "    c\"{name}\",").unwrap();
        writeln!(kinds, "    Ret::{kind},").unwrap();
        writeln!(idx, "    /// `{name}`.\n    pub const {name}: usize = {n};").unwrap();
        match mode {
            "forward" => {
                writeln!(tramps, "trampoline!({name}, {n});").unwrap();
                if name != "ncclResetDebugInitInternal" {
                    writeln!(tramps, "trampoline!(p{name}, {n});").unwrap();
                }
            }
            "own" => {}
            other => panic!("api/nccl-api.txt: unknown mode {other} for {name}"),
        }
        n += 1;
    }
    let out = format!(
        "/// Functions in the table.\npub const COUNT: usize = {n};\n\
         /// Every function's name, by table index.\npub static NAMES: [&std::ffi::CStr; COUNT] = [\n{names}];\n\
         /// Every function's return kind, by table index.\npub static RETURNS: [Ret; COUNT] = [\n{kinds}];\n\
         /// Table indices by name.\n#[allow(non_upper_case_globals, dead_code)]\npub mod idx {{\n{idx}}}\n"
    );
    let dir = std::env::var("OUT_DIR").expect("OUT_DIR");
    std::fs::write(format!("{dir}/table.rs"), out).expect("writing table.rs");
    std::fs::write(format!("{dir}/trampolines.rs"), tramps).expect("writing trampolines.rs");
}
