//! The documentation's examples stay true: README.md and every `docs/*.md` are read, their
//! fenced code blocks are checked with the project's own parsers, and their links must
//! resolve.
//!
//! What each kind of block must pass (the fence's info string says which kind it is):
//!
//! | fence | check |
//! |---|---|
//! | ```` ```toml ```` | a whole cluster file: loads and validates (`Config::from_toml_str`), and every `[tensors]` map parses with the codecs' parameter parser |
//! | ```` ```toml fragment ```` | part of a cluster file: merged into `configs/local.toml`'s text (its tables over the file's), then checked as a whole file |
//! | ```` ```sh ```` | every `pushpull`, `pushpull-worker`, `pushpull-scheduler`, `pushpull-server` or `cargo run --release -- ...` command line parses with the real clap parser; every word that names a path in the repository (`scripts/...`, `python/examples/...`, `configs/...`) exists |
//! | ```` ```python ```` | checked by `python/tests/test_docs.py`: compiled, and run as every worker of a `pushpull local` job unless the fence says `fragment` and why |
//!
//! Outside the blocks: every JSON object of string values in a page (a compression map such as
//! `{"byteps_compressor_type": "onebit"}`) parses with the codecs' parameter parser; every
//! relative link resolves to a file, and every `#anchor` into a markdown file names one of its
//! headings (GitHub's slugs); no heading carries an issue number; the README keeps its two
//! commands and stays short; docs/byteps-variables.md holds `proto`'s table of BytePS's
//! variables and docs/compression.md the codecs' every key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use pushpull::cli::{Cli, WorkerArgs};
use pushpull_kernels::{all_keys, parse_params};
use pushpull_node::cli::{SchedulerArgs, ServerArgs};
use pushpull_proto::Config;

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One markdown page: its path relative to the root and its text.
struct Page {
    path: PathBuf,
    text: String,
}

/// README.md and every `docs/*.md`, in name order.
fn pages() -> Vec<Page> {
    let mut paths = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| PathBuf::from("docs").join(p.file_name().expect("a file name")))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(root().join(&path))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Page { path, text }
        })
        .collect()
}

/// A fenced code block.
struct Block {
    /// The info string's words: the language first (```` ```toml fragment ```` gives
    /// `["toml", "fragment"]`).
    info: Vec<String>,
    /// The line of the opening fence, from 1.
    line: usize,
    /// The block's text, its fence's indentation removed.
    code: String,
}

impl Block {
    /// The language (the info string's first word), or "".
    fn lang(&self) -> &str {
        self.info.first().map(String::as_str).unwrap_or("")
    }
}

/// Splits a page into its fenced code blocks and the text outside them (each line of a block
/// replaced by an empty line, so line numbers are kept).
fn split(text: &str) -> (Vec<Block>, String) {
    let mut blocks = Vec::new();
    let mut prose = String::new();
    let mut open: Option<(usize, usize, Vec<String>, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None if trimmed.starts_with("```") => {
                let info = trimmed[3..].split_whitespace().map(String::from).collect();
                open = Some((i + 1, indent, info, String::new()));
                prose.push('\n');
            }
            None => {
                prose.push_str(line);
                prose.push('\n');
            }
            Some(_) if trimmed.starts_with("```") => {
                let (line, _, info, code) = open.take().expect("a block is open");
                blocks.push(Block { info, line, code });
                prose.push('\n');
            }
            Some((_, indent, _, code)) => {
                let cut = line
                    .char_indices()
                    .take_while(|&(j, c)| j < *indent && c == ' ')
                    .count();
                code.push_str(&line[cut..]);
                code.push('\n');
                prose.push('\n');
            }
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    (blocks, prose)
}

/// Every block of every page, with its page's path.
fn all_blocks() -> Vec<(PathBuf, Block)> {
    pages()
        .into_iter()
        .flat_map(|p| {
            let (blocks, _) = split(&p.text);
            blocks.into_iter().map(move |b| (p.path.clone(), b))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// TOML: cluster files.

/// Merges `over` into `base`: tables recursively, any other value replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Checks one TOML block as a cluster file (a fragment merged into `configs/local.toml`).
fn check_toml(block: &Block, origin: &str) -> Result<(), String> {
    let text = if block.info.iter().any(|w| w == "fragment") {
        let local = std::fs::read_to_string(root().join("configs/local.toml"))
            .map_err(|e| format!("configs/local.toml: {e}"))?;
        let mut base: toml::Table = toml::from_str(&local).map_err(|e| e.to_string())?;
        let over: toml::Table =
            toml::from_str(&block.code).map_err(|e| format!("not TOML: {e}"))?;
        merge(&mut base, over);
        toml::to_string(&base).map_err(|e| e.to_string())?
    } else {
        block.code.clone()
    };
    let config = Config::from_toml_str(&text, origin).map_err(|e| e.to_string())?;
    for table in config.tensors.tables.keys() {
        let params = config.tensor_params(table);
        parse_params(&params).map_err(|e| format!("[tensors.{table:?}]: {e}"))?;
    }
    Ok(())
}

#[test]
fn toml_blocks_are_cluster_files_that_load() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (page, block) in all_blocks() {
        if block.lang() != "toml" {
            continue;
        }
        let origin = format!("{}:{}", page.display(), block.line);
        if let Err(e) = check_toml(&block, &origin) {
            failures.push(format!("{origin}: {e}"));
        }
        checked += 1;
    }
    assert!(checked > 0, "no ```toml block in the documentation");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Shell: command lines.

/// A token of a shell line: a word, or an operator that ends a command.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    End,
}

/// Splits a shell line into words (quotes and backslashes removed; `$VAR` left as written)
/// and command separators (`;`, `&&`, `||`, `|`, `&`); a `#` that starts a word starts a
/// comment.
fn tokens(line: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = word.take() {
                    out.push(Token::Word(w));
                }
            }
            '#' if word.is_none() => break,
            ';' | '&' | '|' => {
                if let Some(w) = word.take() {
                    out.push(Token::Word(w));
                }
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                out.push(Token::End);
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(q) => w.push(q),
                        None => return Err("an unclosed '".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.extend(chars.next()),
                        Some(q) => w.push(q),
                        None => return Err("an unclosed \"".into()),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word.map(Token::Word));
    Ok(out)
}

/// The simple commands of a shell block: lines joined at a trailing backslash, split at the
/// separators, shell keywords (`do`, `then`, ...) and leading `NAME=value` assignments and
/// `sudo` removed; loops' heads (`for ...`) and ends (`done`, `fi`) dropped.
fn commands(code: &str) -> Result<Vec<Vec<String>>, String> {
    let joined = code.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let mut current: Vec<String> = Vec::new();
        for token in tokens(line)?.into_iter().chain([Token::End]) {
            match token {
                Token::Word(w) => current.push(w),
                Token::End => {
                    let mut words = std::mem::take(&mut current);
                    while let Some(first) = words.first() {
                        let assignment = first.split_once('=').is_some_and(|(name, _)| {
                            !name.is_empty()
                                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        });
                        let keyword = ["do", "then", "else", "sudo"].contains(&first.as_str());
                        if assignment || keyword {
                            words.remove(0);
                        } else {
                            break;
                        }
                    }
                    let skip = words.first().is_none_or(|w| {
                        ["for", "while", "if", "done", "fi", "export", "cd"].contains(&w.as_str())
                    });
                    if !skip {
                        out.push(words);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Parses one command line with the clap parser of the program it runs; `Ok(false)` when it
/// runs none of pushpull's programs.
fn parse_command(words: &[String]) -> Result<bool, String> {
    let program = words[0].as_str();
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(program);
    // `pushpull` as a path is only the build's (`target/release/pushpull`).
    let is_path = program.contains('/');
    let built = !is_path || program.trim_start_matches("./").starts_with("target/");
    let result = match (name, built) {
        ("pushpull", true) => Cli::try_parse_from(words).map(drop),
        ("pushpull-worker", true) => WorkerArgs::try_parse_from(words).map(drop),
        ("pushpull-scheduler", true) => SchedulerArgs::try_parse_from(words).map(drop),
        ("pushpull-server", true) => ServerArgs::try_parse_from(words).map(drop),
        ("cargo", _) if words.get(1).map(String::as_str) == Some("run") => {
            let Some(dashes) = words.iter().position(|w| w == "--") else {
                return Err("`cargo run` without `-- ARGS`".into());
            };
            let args =
                std::iter::once("pushpull").chain(words[dashes + 1..].iter().map(|w| w.as_str()));
            Cli::try_parse_from(args).map(drop)
        }
        _ => return Ok(false),
    };
    result.map(|()| true).map_err(|e| e.to_string())
}

/// Top-level folders of the repository whose paths a command may name (build output left
/// out: `target/` need not exist).
fn repo_folders() -> BTreeSet<String> {
    std::fs::read_dir(root())
        .expect("the repository")
        .map(|e| e.expect("an entry"))
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n != "target" && n != ".git")
        .collect()
}

/// The repository path a word names, which must exist: a word whose first component is a
/// top-level folder and which has a `/` (`scripts/test.sh`, `python/examples/train_digits.py`,
/// `./python[example]`, pip's extras removed); words with `$` or `*` are left alone.
fn repo_path(word: &str, folders: &BTreeSet<String>) -> Option<PathBuf> {
    let dotted = word.starts_with("./");
    let word = word.split_once('[').map_or(word, |(path, _)| path);
    let word = word.strip_prefix("./").unwrap_or(word);
    let first = word.split('/').next()?;
    let names_a_path = (dotted || word.contains('/')) && folders.contains(first);
    (names_a_path && !word.contains('$') && !word.contains('*')).then(|| PathBuf::from(word))
}

/// Checks a shell block; the errors, one a line.
fn check_shell(block: &Block) -> Vec<String> {
    let folders = repo_folders();
    let commands = match commands(&block.code) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    let mut errors = Vec::new();
    for words in commands {
        let line = words.join(" ");
        if let Err(e) = parse_command(&words) {
            errors.push(format!("`{line}`: {}", e.trim_end()));
        }
        // The command's own arguments: a word after `python` or a script is a path too.
        for (i, word) in words.iter().enumerate() {
            // The program itself is checked only when it is a path (`scripts/test.sh`).
            if i == 0 && !word.contains('/') {
                continue;
            }
            if let Some(path) = repo_path(word, &folders) {
                if !root().join(&path).exists() {
                    errors.push(format!("`{line}`: {} does not exist", path.display()));
                }
            }
        }
    }
    errors
}

#[test]
fn shell_commands_parse_and_name_files_that_exist() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (page, block) in all_blocks() {
        if !["sh", "bash", "shell"].contains(&block.lang()) {
            continue;
        }
        for e in check_shell(&block) {
            failures.push(format!("{}:{}: {e}", page.display(), block.line));
        }
        checked += 1;
    }
    assert!(checked > 0, "no ```sh block in the documentation");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Compression maps.

/// Every `{"...": ...}` object in `text` (a page, blocks included), with its line; braces
/// inside strings do not count. The object need not be valid JSON: `check_map` says why not.
fn json_objects(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("{\"").map(|i| from + i) {
        let mut depth = 0;
        let mut end = None;
        let (mut in_string, mut escaped) = (false, false);
        for (i, c) in text[at..].char_indices() {
            if in_string {
                (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
                continue;
            }
            match c {
                '"' => in_string = true,
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(at + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        out.push((text[..at].lines().count().max(1), &text[at..end]));
        from = end;
    }
    out
}

/// Checks a compression map: `Ok(false)` when `object` is not one (JSON of other values).
fn check_map(object: &str) -> Result<bool, String> {
    let looks_like_one = object.contains("\"byteps_") || object.contains("\"compressor\"");
    let mut map: BTreeMap<String, String> = match serde_json::from_str(object) {
        Ok(map) => map,
        Err(e) if looks_like_one => return Err(format!("not a JSON map of strings: {e}")),
        Err(_) => return Ok(false),
    };
    // pushpull.torch fills in a PowerSGD map's `rows` from the tensor's shape.
    if map.get("compressor").is_some_and(|c| c == "powersgd") {
        map.entry("rows".into()).or_insert_with(|| "64".into());
    }
    parse_params(&map).map_err(|e| e.to_string())?;
    Ok(true)
}

#[test]
fn compression_maps_parse() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        for (line, object) in json_objects(&page.text) {
            match check_map(object) {
                Ok(true) => checked += 1,
                Ok(false) => {}
                Err(e) => failures.push(format!("{}:{line}: {object}: {e}", page.path.display())),
            }
        }
    }
    assert!(checked > 0, "no compression map in the documentation");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// docs/compression.md's table has a row for every key the codecs know, with its aliases.
#[test]
fn the_compression_page_lists_every_key() {
    let text = std::fs::read_to_string(root().join("docs/compression.md")).expect("the page");
    for key in all_keys() {
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("| `{}` |", key.name)))
            .collect();
        assert!(
            !rows.is_empty(),
            "docs/compression.md has no row for `{}`",
            key.name
        );
        for alias in key.aliases {
            assert!(
                rows.iter().any(|r| r.contains(&format!("`{alias}`"))),
                "docs/compression.md: `{}`'s row does not name its alias `{alias}`",
                key.name
            );
        }
    }
}

/// docs/byteps-variables.md holds `proto`'s table, as generated.
#[test]
fn the_byteps_page_holds_the_variables_table() {
    let text = std::fs::read_to_string(root().join("docs/byteps-variables.md")).expect("the page");
    let table = pushpull_proto::config::env::markdown_table();
    assert!(
        text.contains(&table),
        "docs/byteps-variables.md's table differs from proto/src/config/env.rs's \
         markdown_table(): replace it with this one:\n{table}"
    );
}

// ---------------------------------------------------------------------------------------------
// Links and headings.

/// GitHub's anchor of a heading: lowercase, spaces to `-`, every other character that is not
/// a letter, a digit, `-` or `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown text's headings (a repeated heading's later ones get `-1`,
/// `-2`, ... as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let (_, prose) = split(text);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of a text's inline links and images, `[text](target)`, with their lines;
/// inline code spans are skipped.
fn links(prose: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in prose.lines().enumerate() {
        let mut outside = String::new();
        for (j, part) in line.split('`').enumerate() {
            outside.push_str(if j % 2 == 0 { part } else { "" });
        }
        let mut rest = outside.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// Checks one link of `page`; the error, if any.
fn check_link(page: &Path, target: &str) -> Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        root().join(page)
    } else {
        root().join(page.parent().expect("a folder")).join(path)
    };
    if !file.exists() {
        return Err(format!("{target}: no such file"));
    }
    if let Some(anchor) = anchor {
        if file.extension().is_none_or(|e| e != "md") {
            return Err(format!(
                "{target}: an anchor into a file that is not markdown"
            ));
        }
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        if !anchors(&text).contains(anchor) {
            return Err(format!("{target}: no heading has the anchor #{anchor}"));
        }
    }
    Ok(())
}

#[test]
fn links_resolve() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        let (_, prose) = split(&page.text);
        for (line, target) in links(&prose) {
            if let Err(e) = check_link(&page.path, &target) {
                failures.push(format!("{}:{line}: {e}", page.path.display()));
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no link in the documentation");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn headings_carry_no_issue_numbers() {
    for page in pages() {
        let (_, prose) = split(&page.text);
        for (i, line) in prose.lines().enumerate() {
            if line.starts_with('#') && line.contains("(issue") {
                panic!("{}:{}: {line}", page.path.display(), i + 1);
            }
        }
    }
}

/// The README is the newcomer's page: its two commands are there as CI runs them, and it
/// stays short (the reference lives in docs/).
#[test]
fn the_readme_keeps_the_two_commands_and_stays_short() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let (blocks, _) = split(&text);
    let start = text
        .find("\n## The two commands\n")
        .expect("## The two commands");
    let section_line = text[..start].lines().count() + 1;
    let next = text[start + 1..]
        .find("\n## ")
        .map_or(text.len(), |i| start + 1 + i);
    let section_end_line = text[..next].lines().count();
    let in_section: Vec<&str> = blocks
        .iter()
        .filter(|b| b.line > section_line && b.line <= section_end_line)
        .map(|b| b.code.trim())
        .collect();
    assert_eq!(
        in_section,
        ["cargo run --release -- local", "scripts/test.sh"]
    );
    let lines = text.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines: move reference material to docs/"
    );
}

// ---------------------------------------------------------------------------------------------
// The checkers themselves: each fails on a broken example.

fn block(info: &str, code: &str) -> Block {
    Block {
        info: info.split_whitespace().map(String::from).collect(),
        line: 1,
        code: code.to_string(),
    }
}

#[test]
fn the_checkers_fail_on_broken_examples() {
    // TOML: a whole file without its required keys, a fragment with an unknown key, a bad map.
    assert!(check_toml(&block("toml", "[cluster]\nnum_workers = 2\n"), "t").is_err());
    assert!(check_toml(&block("toml fragment", "[cluster]\nnum_worker = 2\n"), "t").is_err());
    assert!(check_toml(
        &block(
            "toml fragment",
            "[tensors.default]\ncompressor = \"onebits\"\n"
        ),
        "t"
    )
    .is_err());
    assert!(check_toml(
        &block("toml fragment", "[metrics]\nlisten = \"127.0.0.1:0\"\n"),
        "t"
    )
    .is_ok());
    // Shell: an unknown flag, an unknown subcommand, a script that does not exist.
    assert!(!check_shell(&block("sh", "pushpull local --wrkers 2\n")).is_empty());
    assert!(!check_shell(&block("sh", "cargo run --release -- locl\n")).is_empty());
    assert!(!check_shell(&block(
        "sh",
        "X=1 sudo target/release/pushpull bench nett\n"
    ))
    .is_empty());
    assert!(!check_shell(&block("sh", "pushpull-worker --config c.toml --rnk 0\n")).is_empty());
    assert!(!check_shell(&block("sh", "scripts/no-such-script.sh\n")).is_empty());
    assert!(!check_shell(&block(
        "sh",
        "pushpull local --workers 2 -- python python/examples/no_such.py\n"
    ))
    .is_empty());
    assert!(check_shell(&block(
        "sh",
        "for s in 0 1; do\n  pushpull local --workers 2 \\\n    -- python python/examples/train_digits.py --seed $s  # a comment\ndone\n"
    ))
    .is_empty());
    // Maps: an unknown compressor, a key that does not apply, a map that is not JSON.
    assert!(check_map(r#"{"byteps_compressor_type": "onebits"}"#).is_err());
    assert!(check_map(r#"{"compressor": "onebit", "k": "0.1"}"#).is_err());
    assert!(check_map(r#"{"byteps_compressor_type": onebit}"#).is_err());
    assert_eq!(check_map(r#"{"a": 1}"#), Ok(false));
    // A brace inside a string does not end the object.
    let objects = json_objects(r#"x {"a": "}", "b": {"c": "{"}} y {"d": "e"}"#);
    let objects: Vec<&str> = objects.into_iter().map(|(_, o)| o).collect();
    assert_eq!(objects, [r#"{"a": "}", "b": {"c": "{"}}"#, r#"{"d": "e"}"#]);
    // Links: a missing file, a missing anchor, an anchor into a page.
    assert!(check_link(Path::new("README.md"), "docs/no-such-page.md").is_err());
    assert!(check_link(Path::new("README.md"), "#no-such-heading").is_err());
    assert!(check_link(
        Path::new("docs/clusters.md"),
        "../README.md#the-two-commands"
    )
    .is_ok());
    assert!(check_link(Path::new("docs/clusters.md"), "README.md").is_err());
    // Slugs as GitHub makes them.
    assert_eq!(slug("BytePS's variables"), "bytepss-variables");
    assert_eq!(
        slug("`byteps.torch`, name by name"),
        "bytepstorch-name-by-name"
    );
    assert_eq!(
        slug("Two levels: one push per host"),
        "two-levels-one-push-per-host"
    );
}
