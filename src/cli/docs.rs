//! The command-line reference, `docs/cli.md`: every subcommand, flag, environment variable
//! and default, written from the clap definitions themselves (a test keeps the file equal
//! to [`markdown`]), so the manual cannot drift from `--help`.

use std::fmt::Write as _;

use clap::{Arg, Command, CommandFactory};

use super::Cli;

/// Where the reference lives, from the repository root.
pub const DOCS_FILE: &str = "docs/cli.md";

/// The reference, as Markdown: one section per subcommand, its flags in a table per help
/// heading, in the order `--help` shows them.
pub fn markdown() -> String {
    let cli = Cli::command();
    let mut out = String::from(
        "# Command-line reference\n\n<!-- Generated from the clap definitions in src/cli: do not \
         edit. Regenerate with `RATEKEEPER_REGENERATE=1 cargo test --lib cli::docs`. -->\n\n\
         Every flag can also be set by the environment variable beside it; a flag given on the \
         command line wins. The reference service's own variables (`REDIS_URL`, `PORT`, ...) \
         are read too, mapped onto these flags: see [Migrating](migrating.md).\n\n",
    );
    let globals: Vec<&Arg> = cli.get_arguments().filter(|arg| shown(arg)).collect();
    let commands: Vec<&Command> = cli.get_subcommands().filter(|c| !c.is_hide_set()).collect();
    for command in &commands {
        let name = command.get_name();
        let _ = writeln!(out, "- [`ratekeeper {name}`](#ratekeeper-{name})");
    }
    let _ = writeln!(out, "- [Every command's flags](#every-commands-flags)\n");
    for command in commands {
        section(&mut out, command);
    }
    out.push_str("## Every command's flags\n\n");
    table(&mut out, &globals);
    out
}

fn section(out: &mut String, command: &Command) {
    let name = command.get_name();
    let _ = writeln!(out, "## `ratekeeper {name}`\n");
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let args: Vec<&Arg> = command
        .get_arguments()
        .filter(|arg| shown(arg) && !arg.is_global_set())
        .collect();
    let positionals: Vec<&Arg> = args.iter().copied().filter(|a| a.is_positional()).collect();
    if !positionals.is_empty() {
        let names: Vec<String> = positionals.iter().map(|arg| flag(arg)).collect();
        let _ = writeln!(
            out,
            "Usage: `ratekeeper {name} [OPTIONS] {}`\n",
            names.join(" ")
        );
    }
    // Headings in the order their first flag appears, as `--help` shows them.
    let mut headings: Vec<Option<&str>> = Vec::new();
    for arg in &args {
        if !headings.contains(&arg.get_help_heading()) {
            headings.push(arg.get_help_heading());
        }
    }
    for heading in headings {
        let group: Vec<&Arg> = args
            .iter()
            .copied()
            .filter(|arg| arg.get_help_heading() == heading)
            .collect();
        if let Some(heading) = heading {
            let _ = writeln!(out, "### {name}: {heading}\n");
        }
        table(out, &group);
    }
}

fn table(out: &mut String, args: &[&Arg]) {
    out.push_str("| flag | environment | default | meaning |\n| --- | --- | --- | --- |\n");
    for arg in args {
        let env = arg
            .get_env()
            .map(|env| format!("`{}`", env.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|value| format!("`{}`", value.to_string_lossy()))
            .collect();
        let mut meaning = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|help| help.to_string())
            .unwrap_or_default();
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| format!("`{}`", value.get_name()))
            .collect();
        // A switch's possible values are `true`/`false`: not worth a line.
        if !values.is_empty() && arg.get_action().takes_values() && !is_switch(arg) {
            let _ = write!(meaning, " One of: {}.", values.join(", "));
        }
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            flag(arg),
            env,
            defaults.join(", "),
            cell(&meaning)
        );
    }
    out.push('\n');
}

/// Hidden flags and clap's own `--help`/`--version` stay out of the reference.
fn shown(arg: &Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn is_switch(arg: &Arg) -> bool {
    matches!(
        arg.get_action(),
        clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
    )
}

/// `--name VALUE` (`-s` too when it has one), or `NAME` for a positional.
fn flag(arg: &Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map_or_else(|| arg.get_id().as_str().to_uppercase(), ToString::to_string);
    let Some(long) = arg.get_long() else {
        return value;
    };
    let mut flag = match arg.get_short() {
        Some(short) => format!("-{short}, --{long}"),
        None => format!("--{long}"),
    };
    if arg.get_action().takes_values() && !is_switch(arg) {
        let _ = write!(flag, " <{value}>");
    }
    flag
}

/// Help text as one table cell: lines joined, `|` escaped.
fn cell(text: &str) -> String {
    let joined: Vec<&str> = text.split_whitespace().collect();
    joined.join(" ").replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_lists_every_flag_with_its_environment_and_default() {
        let text = markdown();
        for needle in [
            "## `ratekeeper serve`",
            "## `ratekeeper validate`",
            "## `ratekeeper inject`",
            "### serve: Cluster",
            "| `--grpc-addr <GRPC_ADDR>` | `RATEKEEPER_GRPC_ADDR` | `127.0.0.1:8081` |",
            "| `--log <LOG>` | `RUST_LOG` | `info` |",
        ] {
            assert!(
                text.contains(needle),
                "{needle:?} missing from the reference"
            );
        }
        let serve = Cli::command();
        let serve = serve.find_subcommand("serve").expect("serve");
        for arg in serve.get_arguments().filter(|arg| shown(arg)) {
            if let Some(long) = arg.get_long() {
                assert!(text.contains(&format!("`--{long}")), "--{long} not listed");
            }
        }
    }

    #[test]
    fn the_docs_reference_is_generated_from_the_clap_definitions() {
        crate::generated::check(DOCS_FILE, &markdown(), "cli::docs");
    }
}
