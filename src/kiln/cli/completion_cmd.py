"""``kiln completion bash|zsh``: a shell completion script on stdout.

    eval "$(kiln completion bash)"     # in ~/.bashrc
    eval "$(kiln completion zsh)"      # in ~/.zshrc

It completes the commands, each command's options (and the values of those with
a fixed set of choices), file names after an option that takes a path, the build
module (``.py`` files), and then the module's entrypoints, which it asks ``kiln
list MODULE --bare`` for (so completing a target runs the module, as a build does);
a name is offered as its line says, never expanded by the shell (``$(...)`` in a
name runs nothing).
The options are read from kiln's own parsers when the script is made: remake it
after upgrading kiln.
"""

from __future__ import annotations

import argparse
import shlex
from typing import IO

from kiln.cli.options import COMMAND_HELP, KilnArgumentParser, command_parser
from kiln.cli.plain_parsers import (
    cache_parser,
    clean_parser,
    compare_parser,
    devices_parser,
    report_parser,
)

_SHELLS = ("bash", "zsh")


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    parser = KilnArgumentParser(
        prog="kiln completion",
        description='Print a completion script for bash or zsh: eval "$(kiln completion '
        'bash)" in ~/.bashrc, or zsh in ~/.zshrc.',
    )
    parser.add_argument("shell", choices=_SHELLS, help="the shell to complete kiln in")
    ns = parser.parse_args(argv)
    script = _bash_script()
    if ns.shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    print(script, file=out, end="")
    return 0


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers: dict[str, argparse.ArgumentParser] = {
        c: command_parser(c, "kiln", None) for c in ("build", "list", "explain", "graph")
    }
    parsers.update(
        clean=clean_parser(),
        report=report_parser(),
        compare=compare_parser(),
        devices=devices_parser(),
    )
    for action in cache_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                parsers[f"cache {name}"] = sub
    return parsers


def _option_words(parser: argparse.ArgumentParser) -> tuple[list[str], list[str], dict[str, str]]:
    """(every option string, those that take a value, the choices of those that
    have a fixed set of values) of ``parser``."""
    words: list[str] = []
    valued: list[str] = []
    choices: dict[str, str] = {}
    for action in parser._actions:
        if not action.option_strings:
            continue
        words += action.option_strings
        if action.nargs != 0:
            valued += action.option_strings
            if action.choices is not None:
                for s in action.option_strings:
                    choices[s] = " ".join(str(c) for c in action.choices)
    return words, valued, choices


def _bash_script() -> str:
    cases = []
    for name, parser in _parsers().items():
        words, valued, choices = _option_words(parser)
        choice_cases = "".join(
            f"                {shlex.quote(o)}) values={shlex.quote(v)} ;;\n"
            for o, v in choices.items()
        )
        cases.append(
            f"        {shlex.quote(name)})\n"
            f"            opts={shlex.quote(' '.join(words))}\n"
            f"            valued={shlex.quote(' ' + ' '.join(valued) + ' ')}\n"
            f"            case $prev in\n{choice_cases}            esac ;;\n"
        )
    commands = " ".join(COMMAND_HELP)
    return _TEMPLATE.replace("@COMMANDS@", commands).replace("@CASES@", "".join(cases))


_TEMPLATE = r"""# kiln's completion for bash (and zsh through bashcompinit): kiln completion bash
_kiln() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local cmd=${COMP_WORDS[1]} opts="" valued=" " values="" module="" i
    COMPREPLY=()
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "@COMMANDS@ --help --version" -- "$cur"))
        return 0
    fi
    if [[ $cmd == cache ]]; then
        if [[ $COMP_CWORD -eq 2 ]]; then
            COMPREPLY=($(compgen -W "stats gc clear" -- "$cur"))
            return 0
        fi
        cmd="cache ${COMP_WORDS[2]}"
    fi
    case $cmd in
@CASES@    esac
    if [[ -n $values ]]; then
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
        return 0
    fi
    if [[ $valued == *" $prev "* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        return 0
    fi
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return 0
    fi
    for ((i = 2; i < COMP_CWORD; i++)); do
        if [[ ${COMP_WORDS[i]} == *.py && -f ${COMP_WORDS[i]} ]]; then
            module=${COMP_WORDS[i]}
            break
        fi
    done
    if [[ -n $module && $cmd != cache* && $cmd != clean && $cmd != report ]]; then
        # Not compgen -W: it expands its words ($(...), `...`, $VAR, ~, globs) and a
        # name is the module's text. Each line is compared as it is, never expanded.
        local name
        while IFS= read -r name; do
            [[ -n $name && $name == "$cur"* ]] && COMPREPLY+=("$name")
        done < <(kiln list "$module" --bare 2>/dev/null)
    else
        COMPREPLY=($(compgen -f -X '!*.py' -- "$cur") $(compgen -d -- "$cur"))
    fi
    return 0
}
complete -o filenames -F _kiln kiln
"""
