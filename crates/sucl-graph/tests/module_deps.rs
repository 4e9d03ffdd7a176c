//! The crate's modules depend on each other one way only: no two source files refer to each
//! other (`crate::a` in `b.rs` and `crate::b` in `a.rs`), so each can be read, tested and
//! changed with only the modules below it in mind.

use std::collections::{BTreeMap, BTreeSet};

/// The modules of the crate that `text` refers to through `crate::NAME` paths, including the
/// grouped form `crate::{a, b::c}`.
fn references(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let names: Vec<String> = match rest.strip_prefix('{') {
            Some(group) => group.split('}').next().unwrap_or("").split(',').map(|p| ident(p.trim())).collect(),
            None => vec![ident(rest)],
        };
        out.extend(names.into_iter().filter(|n| modules.contains(n)));
    }
    out
}

#[test]
fn no_two_modules_import_each_other() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    assert!(modules.contains("command") && modules.contains("dump"), "the crate's modules are found: {modules:?}");
    let deps: BTreeMap<&String, BTreeSet<String>> = files.iter().map(|(m, text)| (m, references(text, &modules))).collect();
    let mut cycles = Vec::new();
    for (a, uses) in &deps {
        for b in uses.iter().filter(|b| *b != *a && a < b) {
            if deps[b].contains(*a) {
                cycles.push(format!("{a}.rs <-> {b}.rs"));
            }
        }
    }
    assert!(cycles.is_empty(), "modules that import each other: {cycles:?}");
}
