//! The layer map in `src/lib.rs` holds: no file imports a layer above its own, and no files import
//! each other in a circle (`a.rs` → `b.rs` → … → `a.rs`).
//!
//! Every path a source file names is resolved to the file that defines it: `use` trees and
//! paths in code and macros that start with `crate`, `super`, `self` or a submodule the file
//! declares. A file's use of its own ancestors (the `mod.rs` that declares it, and so on up) is
//! the module tree, not an import. Test-only code (`#[cfg(test)]` items and modules) is left
//! out: a test may reach for fixtures anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// A module path (`["gpu", "caching"]`) and the file that defines it.
type Modules = BTreeMap<Vec<String>, PathBuf>;

fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(SRC).unwrap().with_extension("");
    let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        segs.pop();
    }
    segs
}

/// Every `.rs` file under `src/` that is not test-only, by module path.
fn modules() -> Modules {
    let mut test_only = BTreeSet::new();
    let mut all = Modules::new();
    let mut stack = vec![PathBuf::from(SRC)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let module = module_of(&path);
                let ast = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
                for item in &ast.items {
                    if let syn::Item::Mod(m) = item {
                        if is_test_only(&m.attrs) {
                            let mut child = module.clone();
                            child.push(m.ident.to_string());
                            test_only.insert(child);
                        }
                    }
                }
                all.insert(module, path);
            }
        }
    }
    all.retain(|module, _| !test_only.iter().any(|t| module.starts_with(t)));
    all
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.to_token_stream().to_string().contains("test"))
}

/// Flattens a `use` tree into full paths (`a::{b, c::d}` → `a::b`, `a::c::d`).
fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(prefix.iter().cloned().chain([n.ident.to_string()]).collect()),
        syn::UseTree::Rename(r) => out.push(prefix.iter().cloned().chain([r.ident.to_string()]).collect()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, out)),
    }
}

/// Paths written as `ident :: ident :: …` anywhere in a token stream (code, types, macro input).
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => token_paths(g.stream(), out),
            TokenTree::Ident(first) => {
                // Only where a path starts: its later segments are read from its first.
                let after_colons = i >= 2 && is_punct(&tokens[i - 1], ':') && is_punct(&tokens[i - 2], ':');
                if !after_colons {
                    let mut path = vec![first.to_string()];
                    let mut j = i + 1;
                    while j + 1 < tokens.len() && is_punct(&tokens[j], ':') && is_punct(&tokens[j + 1], ':') {
                        match tokens.get(j + 2) {
                            Some(TokenTree::Ident(next)) => {
                                path.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if path.len() > 1 {
                        out.push(path);
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
}

fn is_punct(t: &TokenTree, c: char) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == c)
}

/// The module a path names, made absolute from `here` (the file's module).
fn absolute(path: &[String], here: &[String], children: &BTreeSet<String>) -> Option<Vec<String>> {
    let (mut base, mut rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
        "crate" => (vec![], &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => (here.to_vec(), path),
        first if children.contains(first) => (here.to_vec(), path),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The files each file imports.
fn imports(modules: &Modules) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut edges = BTreeMap::new();
    for (here, file) in modules {
        let ast = syn::parse_file(&std::fs::read_to_string(file).unwrap()).unwrap();
        let mut paths = Vec::new();
        let mut children = BTreeSet::new();
        for item in &ast.items {
            match item {
                syn::Item::Mod(m) if !is_test_only(&m.attrs) => {
                    children.insert(m.ident.to_string());
                }
                syn::Item::Use(u) if !is_test_only(&u.attrs) => use_paths(&u.tree, &mut vec![], &mut paths),
                _ => {}
            }
        }
        for item in &ast.items {
            let attrs: &[syn::Attribute] = match item {
                syn::Item::Use(_) | syn::Item::Mod(_) => continue,
                syn::Item::Fn(f) => &f.attrs,
                syn::Item::Impl(i) => &i.attrs,
                syn::Item::Const(c) => &c.attrs,
                syn::Item::Static(s) => &s.attrs,
                _ => &[],
            };
            if !is_test_only(attrs) {
                token_paths(item.to_token_stream(), &mut paths);
            }
        }
        let targets = edges.entry(file.clone()).or_insert_with(BTreeSet::new);
        for path in paths {
            let Some(abs) = absolute(&path, here, &children) else { continue };
            // The longest prefix that is a module file defines what the path names.
            let target = (0..=abs.len()).rev().find_map(|n| modules.get(&abs[..n]));
            // A file's use of its ancestors (`super::` items of the mod.rs that declares it) is
            // the module tree, not an import; siblings and everything else count.
            let ancestor = |t: &PathBuf| module_of(t).len() < here.len() && here.starts_with(&module_of(t));
            if let Some(target) = target.filter(|t| *t != file && !ancestor(t)) {
                targets.insert(target.clone());
            }
        }
    }
    edges
}

/// The layer of each top-level module, read from the numbered map in `src/lib.rs`'s doc comment
/// (`//! 3. [`trace`], [`workload`] …`).
fn layer_map() -> BTreeMap<String, u32> {
    let lib = std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap();
    let mut layers = BTreeMap::new();
    let mut current = None;
    for line in lib.lines().take_while(|l| l.starts_with("//!")) {
        let text = line.trim_start_matches("//!").trim_start();
        if let Some((n, _)) = text.split_once(". ").filter(|(n, _)| n.parse::<u32>().is_ok()) {
            current = n.parse().ok();
        } else if text.starts_with('#') || text.is_empty() {
            current = None;
        }
        let Some(layer) = current else { continue };
        // Only the top-level names: `[`gpu::device::Device`]` names a module already listed.
        for link in text.split("[`").skip(1) {
            let name = link.split('`').next().unwrap();
            if !name.contains("::") {
                layers.entry(name.to_string()).or_insert(layer);
            }
        }
    }
    layers
}

/// Strongly connected components of more than one file (Tarjan's algorithm, iteration-free).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.stack.contains(&w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().position(|x| *x == v).unwrap();
                let component: Vec<PathBuf> = self.stack.drain(at..).cloned().collect();
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], found: vec![] };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn short(p: &Path) -> String {
    p.strip_prefix(SRC).unwrap().display().to_string()
}

#[test]
fn no_file_imports_a_higher_layer() {
    let layers = layer_map();
    assert!(layers.len() >= 10, "src/lib.rs's map names the top-level modules: {layers:?}");
    let modules = modules();
    let layer_of = |file: &Path| -> u32 {
        let top = module_of(file).first().cloned().unwrap_or_default();
        if top.is_empty() {
            return u32::MAX; // lib.rs / main.rs: the root sees everything
        }
        *layers.get(&top).unwrap_or_else(|| panic!("src/{top} is not in src/lib.rs's layer map: add it to its layer"))
    };
    let mut upward = Vec::new();
    for (from, targets) in imports(&modules) {
        for to in targets {
            if layer_of(&to) > layer_of(&from) {
                upward.push(format!("{} (layer {}) imports {} (layer {})", short(&from), layer_of(&from), short(&to), layer_of(&to)));
            }
        }
    }
    assert!(upward.is_empty(), "imports against the layer map in src/lib.rs:\n{}", upward.join("\n"));
}

#[test]
fn no_files_import_each_other_in_a_circle() {
    let found = circles(&imports(&modules()));
    let described: Vec<String> = found.iter().map(|c| c.iter().map(|p| short(p)).collect::<Vec<_>>().join(" ↔ ")).collect();
    assert!(described.is_empty(), "import circles:\n{}", described.join("\n"));
}

/// The checker sees what it must: a `use` group, a path inside a macro, `super` and a
/// submodule declared by the file.
#[test]
fn the_checker_finds_imports_in_every_form() {
    let file: syn::File =
        syn::parse_str("mod child; use super::{a, b::C}; fn f() { println!(\"{}\", crate::x::y()); child::g(); let v = Vec::<u8>::new(); }").unwrap();
    let mut paths = Vec::new();
    let mut children = BTreeSet::new();
    for item in &file.items {
        match item {
            syn::Item::Use(u) => use_paths(&u.tree, &mut vec![], &mut paths),
            syn::Item::Mod(m) => {
                children.insert(m.ident.to_string());
            }
            other => token_paths(other.to_token_stream(), &mut paths),
        }
    }
    let here = vec!["m".to_string(), "n".to_string()];
    let resolved: BTreeSet<Vec<String>> = paths.iter().filter_map(|p| absolute(p, &here, &children)).collect();
    let expect = |s: &str| s.split("::").map(str::to_string).collect::<Vec<_>>();
    for want in ["m::a", "m::b::C", "x::y", "m::n::child::g"] {
        assert!(resolved.contains(&expect(want)), "{want} not found in {resolved:?}");
    }
    assert!(!resolved.iter().any(|p| p.contains(&"Vec".to_string())), "{resolved:?}");
    // And a circle of two files is a circle.
    let (a, b, c) = (PathBuf::from("a"), PathBuf::from("b"), PathBuf::from("c"));
    let edges = BTreeMap::from([(a.clone(), BTreeSet::from([b.clone()])), (b.clone(), BTreeSet::from([a.clone(), c.clone()])), (c, BTreeSet::new())]);
    assert_eq!(circles(&edges).len(), 1);
}
