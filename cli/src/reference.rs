//! `docs/cli.md`, rendered from the command's own clap definitions so that the reference and
//! the binary cannot disagree (a test compares them), and the rule that every option says what
//! it does when it is not given.

use clap::{ArgAction, Command};

/// Where the reference lives, from the crate's folder.
pub const DOCS_PATH: &str = "../docs/cli.md";

/// The environment variable that makes the reference test rewrite `docs/cli.md`.
pub const UPDATE_VAR: &str = "STRATA_UPDATE_DOCS";

/// The CLI reference as Markdown: every command and subcommand's `--help`, in definition
/// order. Environment values are hidden, so the text does not depend on who renders it.
pub fn markdown(cli: Command) -> String {
    let mut cli = without_env_values(cli);
    cli.build();
    let mut out = String::from(
        "# `strata` command reference\n\n\
         Every command's `--help`, generated from the definitions in `cli/src/`.\n\
         A test (`reference::tests`) fails when this file and the binary disagree; regenerate it\n\
         with `STRATA_UPDATE_DOCS=1 cargo nextest run -p strata-cli --bin strata reference`.\n\n\
         Durations take a unit (`500ms`, `10s`, `2m`, `1h`) or are bare seconds; sizes take\n\
         `KiB`/`MiB`/`GiB` (powers of two), `KB`/`MB`/`GB` (powers of ten) or are bare bytes.\n\
         Exit codes: 0 success, 1 error (one line on stderr), 2 usage.\n",
    );
    let mut index = String::from("\n## Commands\n\n");
    let mut sections = String::new();
    render(&cli, "strata", 0, &mut index, &mut sections);
    out.push_str(&index);
    out.push_str(&sections);
    out
}

fn render(command: &Command, path: &str, depth: usize, index: &mut String, sections: &mut String) {
    let anchor = path.replace(' ', "-");
    let about = command
        .get_about()
        .map(|about| about.to_string())
        .unwrap_or_default();
    let first_line = about.split(". ").next().unwrap_or("").trim_end_matches('.');
    index.push_str(&format!(
        "{}- [`{path}`](#{anchor}){}\n",
        "  ".repeat(depth),
        if first_line.is_empty() {
            String::new()
        } else {
            format!(": {first_line}")
        }
    ));
    let help = command.clone().render_long_help().to_string();
    let help: Vec<&str> = help.trim_end().lines().map(str::trim_end).collect();
    sections.push_str(&format!(
        "\n## {path}\n\n```text\n{}\n```\n",
        help.join("\n")
    ));
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        render(
            sub,
            &format!("{path} {}", sub.get_name()),
            depth + 1,
            index,
            sections,
        );
    }
}

fn without_env_values(command: Command) -> Command {
    command
        .mut_args(|arg| arg.hide_env_values(true))
        .mut_subcommands(without_env_values)
}

/// Options that take a value, may be left out, and whose help says neither a default nor
/// what leaving them out means: `command path --flag` of each.
pub fn options_without_a_stated_default(cli: Command) -> Vec<String> {
    let mut cli = cli;
    cli.build();
    let mut missing = Vec::new();
    check_defaults(&cli, "strata", &mut missing);
    missing
}

/// Words by which a help text says what happens without the option.
const STATES_DEFAULT: [&str; 4] = ["default", "unless", "without", "when not given"];

fn check_defaults(command: &Command, path: &str, missing: &mut Vec<String>) {
    // One of a required group's options is always given (`reset-offsets --to-offset N`):
    // none of them has a default to state.
    let chosen: Vec<&clap::Id> = command
        .get_groups()
        .filter(|group| group.is_required_set())
        .flat_map(|group| group.get_args())
        .collect();
    for arg in command.get_arguments() {
        if chosen.contains(&arg.get_id()) {
            continue;
        }
        let takes_value = matches!(arg.get_action(), ArgAction::Set | ArgAction::Append);
        if !takes_value
            || arg.is_positional()
            || arg.is_required_set()
            || arg.is_hide_set()
            || !arg.get_default_values().is_empty()
        {
            continue;
        }
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|help| help.to_string().to_lowercase())
            .unwrap_or_default();
        if !STATES_DEFAULT.iter().any(|word| help.contains(word)) {
            let help = help.lines().next().unwrap_or("").to_string();
            let name = arg.get_long().unwrap_or(arg.get_id().as_str());
            missing.push(format!("{path} --{name}: {help}"));
        }
    }
    for sub in command.get_subcommands() {
        if sub.get_name() != "help" {
            check_defaults(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::Cli;

    /// `docs/cli.md` is what the binary's definitions render.
    #[test]
    fn the_reference_matches_the_binary() {
        let rendered = markdown(Cli::command());
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DOCS_PATH);
        if std::env::var_os(UPDATE_VAR).is_some() {
            std::fs::write(&path, &rendered).unwrap();
            return;
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == rendered,
            "docs/cli.md is out of date with the CLI's definitions: regenerate it with \
             {UPDATE_VAR}=1 cargo nextest run -p strata-cli --bin strata reference"
        );
    }

    /// An option a user may leave out says what happens then.
    #[test]
    fn every_option_states_its_default() {
        let missing = options_without_a_stated_default(Cli::command());
        assert!(
            missing.is_empty(),
            "options whose help states no default: {missing:#?}"
        );
    }

    /// The reference covers nested subcommands and hides environment values.
    #[test]
    fn the_reference_lists_every_command() {
        let rendered = markdown(Cli::command());
        for heading in [
            "## strata serve",
            "## strata topic create",
            "## strata log dump",
        ] {
            assert!(rendered.contains(&format!("\n{heading}\n")), "{heading}");
        }
        // SAFETY: nextest runs each test in a process of its own; no other thread touches the
        // environment meanwhile.
        unsafe { std::env::set_var("STRATA_BOOTSTRAP", "10.9.9.9:1") };
        let with_env = markdown(Cli::command());
        unsafe { std::env::remove_var("STRATA_BOOTSTRAP") };
        assert!(
            !with_env.contains("10.9.9.9"),
            "environment values are hidden"
        );
    }
}
