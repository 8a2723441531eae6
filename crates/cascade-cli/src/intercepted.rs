//! The list of functions libcascade intercepts, `crates/cascade-preload/intercepted.txt`,
//! compiled into the binary. `cascade link-flags` prints a `--wrap` flag per wrapped name;
//! `cascade check-binary` counts every name on the list as covered.
//!
//! Format: one name per line; `#` starts a comment (to the end of the line); blank lines
//! are skipped. A name written `=NAME` has no wrapper of its own: it is covered through
//! glibc (a stdio function that reaches a Cascade stream through its fopencookie
//! functions), so it is covered but not wrapped.

use crate::failure::Failure;

/// The list as the preload crate keeps it.
pub const LIST: &str = include_str!("../../cascade-preload/intercepted.txt");

/// The parsed list.
#[derive(Debug)]
pub struct Intercepted {
    /// Functions with a wrapper, in file order: one `-Wl,--wrap=NAME` each.
    pub wrapped: Vec<&'static str>,
    /// Functions covered without a wrapper (`=NAME` lines), in file order.
    pub through_glibc: Vec<&'static str>,
}

impl Intercepted {
    /// The compiled-in list.
    pub fn load() -> Result<Intercepted, Failure> {
        parse(LIST).map_err(|why| {
            Failure::new(format!(
                "internal: intercepted.txt compiled into cascade: {why}"
            ))
        })
    }

    /// Whether calls to `name` reach Cascade (wrapped, or covered through glibc).
    pub fn covers(&self, name: &str) -> bool {
        self.wrapped.contains(&name) || self.through_glibc.contains(&name)
    }
}

/// Parses the list; errors name the line ("line 12: ...").
pub fn parse(text: &'static str) -> Result<Intercepted, String> {
    let mut list = Intercepted {
        wrapped: Vec::new(),
        through_glibc: Vec::new(),
    };
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let entry = line.split('#').next().unwrap_or_default().trim();
        if entry.is_empty() {
            continue;
        }
        let (name, covered_by_glibc) = match entry.strip_prefix('=') {
            Some(rest) => (rest.trim(), true),
            None => (entry, false),
        };
        let is_symbol = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !is_symbol {
            return Err(format!("line {number}: {entry:?} is not a C function name"));
        }
        if list.covers(name) {
            return Err(format!("line {number}: {name} is listed twice"));
        }
        if covered_by_glibc {
            list.through_glibc.push(name);
        } else {
            list.wrapped.push(name);
        }
    }
    if list.wrapped.is_empty() {
        return Err("no functions listed".to_string());
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_list_parses_without_duplicates() {
        let list = parse(LIST).expect("intercepted.txt parses");
        let mut all: Vec<&str> = list
            .wrapped
            .iter()
            .chain(&list.through_glibc)
            .copied()
            .collect();
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "duplicate names in intercepted.txt");
        for name in ["open", "openat", "read", "write", "close", "fstat", "fopen"] {
            assert!(list.wrapped.contains(&name), "{name} is not wrapped");
        }
        // '=' names are covered but never wrapped, and carry no '='.
        assert!(list.through_glibc.contains(&"fclose"));
        assert!(!list.wrapped.contains(&"fclose"));
        assert!(list.covers("fclose") && list.covers("open"));
        assert!(!list.covers("malloc"));
        assert!(all.iter().all(|n| !n.contains('=')));
    }

    #[test]
    fn comments_blanks_and_glibc_entries() {
        let list = parse("# heading\n\nopen # the main one\n  read  \n=fclose\n= fread\n")
            .expect("parses");
        assert_eq!(list.wrapped, ["open", "read"]);
        assert_eq!(list.through_glibc, ["fclose", "fread"]);
    }

    #[test]
    fn duplicates_and_junk_are_rejected_with_the_line() {
        assert_eq!(
            parse("open\nread\n=open\n").unwrap_err(),
            "line 3: open is listed twice"
        );
        assert_eq!(
            parse("open\nread write\n").unwrap_err(),
            "line 2: \"read write\" is not a C function name"
        );
        assert!(parse("open\n=\n").unwrap_err().starts_with("line 2:"));
        assert!(parse("# nothing\n").is_err());
    }
}
