//! Command-line handling shared by the sucl-graph benchmark examples: `--help` (printed
//! before anything starts), flags with values, and one-line errors for bad arguments.

// Each example uses the helpers it needs.
#![allow(dead_code)]

use std::str::FromStr;

/// The arguments of this process.
pub struct Args {
    list: Vec<String>,
    program: String,
}

impl Args {
    /// The process's arguments. With `--help` or `-h` among them, prints `help` and exits 0
    /// before any rank starts or any work runs.
    pub fn from_env(help: &str) -> Args {
        let list: Vec<String> = std::env::args().collect();
        let program = list
            .first()
            .and_then(|p| std::path::Path::new(p).file_name())
            .map_or_else(|| "example".to_string(), |n| n.to_string_lossy().into_owned());
        if list.iter().skip(1).any(|a| a == "--help" || a == "-h") {
            print!("{help}");
            std::process::exit(0);
        }
        Args { list, program }
    }

    /// The `i`-th argument (0: the first after the program's name).
    pub fn positional(&self, i: usize) -> Option<&str> {
        self.list.get(i + 1).map(String::as_str)
    }

    /// True if `name` is given.
    pub fn flag(&self, name: &str) -> bool {
        self.list.iter().any(|a| a == name)
    }

    /// The value after `name`, if given.
    pub fn value(&self, name: &str) -> Option<&str> {
        let at = self.list.iter().position(|a| a == name)?;
        match self.list.get(at + 1) {
            Some(v) => Some(v),
            None => self.fail(format!("{name} needs a value")),
        }
    }

    /// The number after `name`, or `default`; a value that is not a number ends the process
    /// with a one-line error.
    pub fn num<T: FromStr>(&self, name: &str, default: T) -> T {
        match self.value(name) {
            None => default,
            Some(v) => v.trim().parse().unwrap_or_else(|_| self.fail(format!("{name}: want a number, got {v:?}"))),
        }
    }

    /// Prints `message` as one line naming the program and exits with status 2 (bad usage).
    pub fn fail(&self, message: impl std::fmt::Display) -> ! {
        eprintln!("{}: {message} (--help for usage)", self.program);
        std::process::exit(2);
    }
}
