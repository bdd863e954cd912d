"""One set of CLI conventions (issue 31 item 7), checked on every verb's parser (the sweep's included, whatever module
registers it): the model is positional; the main output is -o/--output; one option name per concept (and one
concept per option name, older spellings only as listed aliases); one --seed range; every argument has help and
the help shows every default (0 included). Also: `zoo` knows every name `sweep zoo:NAME@S` knows, with the same
size syntax, and every figure colours the engines by one map.

`violations(parser)` is the checker; it is run on the real parser (no violation) and on a parser that breaks each
rule once (each violation found), so it can fail."""
from __future__ import annotations

import argparse

import pytest

from opendpu.runtime.cli import VERBS, build_parser, main
from opendpu.runtime.cli.common import LEGACY_ALIASES, SEED_MAX, _Fmt, _Parser, int_range

# verbs whose positional is not one model: zoo names zoo models, sweep takes several, targets takes none
POSITIONAL = {"zoo": "names", "sweep": "models", "targets": None}
# one concept, one destination, one canonical option name
CANONICAL = {"output": "--output", "samples": "--samples", "limit": "--limit", "seed": "--seed",
             "target": "--target"}
# old per-verb names of those concepts: none may be a destination any more
RETIRED_DESTS = {"n", "check_n", "random", "output_dir", "export"}


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _actions(sp: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in sp._actions if not isinstance(a, argparse._HelpAction)]


def _shown(a: argparse.Action) -> bool:
    return not (a.default is None or a.default is False or a.default is argparse.SUPPRESS)


def violations(p: argparse.ArgumentParser, legacy: dict = LEGACY_ALIASES) -> list[str]:
    out: list[str] = []
    names: dict[str, set[str]] = {}          # option string -> destinations, over every verb
    for verb, sp in _subparsers(p).items():
        acts = _actions(sp)
        old = legacy.get(verb, {})
        for a in acts:                                          # help on every argument, defaults shown
            label = "/".join(a.option_strings) or a.dest
            if not (a.help or "").strip():
                out.append(f"{verb} {label}: no help")
            if _shown(a) and f"(default: {a.default})" not in _help_of(sp, a):
                out.append(f"{verb} {label}: default {a.default!r} not shown")
            if a.dest in RETIRED_DESTS:
                out.append(f"{verb} {label}: destination {a.dest!r} (a retired name)")
            canon = CANONICAL.get(a.dest)
            if canon and a.option_strings and canon not in a.option_strings:
                out.append(f"{verb} {label}: {a.dest} is spelled {canon} in every verb")
            if a.dest == "output" and a.option_strings and "-o" not in a.option_strings:
                out.append(f"{verb} {label}: the output is -o/--output")
            if a.dest == "seed":
                out += [f"{verb} --seed: {why}" for why in _seed_range(a)]
            for s in a.option_strings:
                if s in old:
                    continue
                names.setdefault(s, set()).add(a.dest)
                if s in ("-o", "--output", "--output_dir", "--output-dir", "--export") and a.dest != "output":
                    out.append(f"{verb} {s}: an output option whose destination is {a.dest!r}, not output")
        for s, canon in old.items():                            # aliases exist and belong to their canonical one
            owner = [a for a in acts if s in a.option_strings]
            if not owner:
                out.append(f"{verb} {s}: a listed alias that the parser does not have")
            elif canon.startswith("-") and canon not in owner[0].option_strings:
                out.append(f"{verb} {s}: an alias of {canon}, but not on the same argument")
        want = POSITIONAL.get(verb, "model")
        pos = [a.dest for a in acts if not a.option_strings]
        if want and (not pos or pos[0] != want):
            out.append(f"{verb}: the first positional is {pos[0] if pos else None!r}, not {want!r}")
    for s, dests in names.items():
        if len(dests) > 1:
            out.append(f"{s}: means {sorted(dests)} in different verbs")
    return out


def _help_of(sp: argparse.ArgumentParser, a: argparse.Action) -> str:
    """The help lines `sp` prints for the one argument `a` (its own formatter), on one line."""
    fmt = sp._get_formatter()
    fmt.add_argument(a)
    return " ".join(fmt.format_help().split())


def _seed_range(a: argparse.Action) -> list[str]:
    bad = []
    for v, ok in (("0", True), (str(SEED_MAX), True), ("-1", False), (str(SEED_MAX + 1), False)):
        try:
            a.type(v)
            got = True
        except argparse.ArgumentTypeError:
            got = False
        if got != ok:
            bad.append(f"{v} {'refused' if ok else 'accepted'} (the range is 0..{SEED_MAX})")
    return bad


def test_every_verb_follows_the_conventions():
    p = build_parser()
    assert set(_subparsers(p)) == set(VERBS) and "sweep" in VERBS
    assert violations(p) == []


def _bad_parser() -> argparse.ArgumentParser:
    """One violation of each rule."""
    p = _Parser(prog="opendpu", formatter_class=_Fmt)
    sub = p.add_subparsers(dest="cmd")
    a = sub.add_parser("alpha", formatter_class=_Fmt)
    a.add_argument("-x", "--xmodel", dest="model", help="the model as an option")                     # not positional
    a.add_argument("-n", type=int, default=2, dest="n", help="inputs")                                 # retired dest
    a.add_argument("--seed", type=int_range(0, 2**63 - 1), default=0, help="seed")                     # other range
    a.add_argument("--output_dir", dest="output", help="out")                                          # not -o/--output
    a.add_argument("--level", type=int, default=0)                                                     # no help
    b = sub.add_parser("beta", formatter_class=argparse.HelpFormatter)
    b.add_argument("model", help="the model")
    b.add_argument("--count", dest="samples", type=int, default=0, help="how many")                   # not --samples
    b.add_argument("--level", dest="depth", help="another meaning of --level")                         # two meanings
    b.add_argument("--lower", default=0, help="default not shown by this formatter")
    return p


def test_the_checker_finds_each_violation():
    got = violations(_bad_parser(), legacy={"beta": {"--gone": "--samples"}})
    assert sorted(got) == sorted([
        "alpha: the first positional is None, not 'model'",
        "alpha -n: destination 'n' (a retired name)",
        f"alpha --seed: {SEED_MAX + 1} accepted (the range is 0..{SEED_MAX})",
        "alpha --output_dir: output is spelled --output in every verb",
        "alpha --output_dir: the output is -o/--output",
        "alpha --level: no help",
        "alpha --level: default 0 not shown",
        "beta --count: samples is spelled --samples in every verb",
        "beta --count: default 0 not shown",            # the plain formatter hides it; _Fmt showed alpha -n's 2
        "beta --lower: default 0 not shown",
        "beta --gone: a listed alias that the parser does not have",
        "--level: means ['depth', 'level'] in different verbs"])


def test_formatter_shows_zero_and_hides_unset():
    p = _Parser(prog="x", formatter_class=_Fmt)
    p.add_argument("--zero", type=int, default=0, help="z")
    p.add_argument("--fzero", type=float, default=0.0, help="f")
    p.add_argument("--unset", help="u")
    p.add_argument("--flag", action="store_true", help="g")
    text = " ".join(p.format_help().split())
    assert "z (default: 0)" in text and "f (default: 0.0)" in text
    assert "u (default" not in text and "g (default" not in text


def test_legacy_spellings_still_parse():
    """Older spellings give the same namespace as the canonical ones."""
    p = build_parser()
    assert p.parse_args(["check", "m.xmodel", "-n", "3"]).samples == 3
    assert p.parse_args(["check", "m.xmodel", "--samples", "3"]).samples == 3
    build = ["build", "m.onnx", "--calib", "c", "--target", "B512", "-o", "o"]
    assert p.parse_args(build + ["--check-n", "4"]).samples == 4
    assert p.parse_args(["cosim", "--random", "5"]).samples == 5
    a = p.parse_args(["compile", "-x", "q.xmodel", "--output_dir", "d", "--net_name", "n", "--target", "B512"])
    assert (a.xmodel, a.model, a.output, a.net_name) == ("q.xmodel", None, "d", "n")
    a = p.parse_args(["compile", "q.xmodel", "-o", "d", "--target", "B512"])
    assert (a.xmodel, a.model, a.output, a.net_name) == (None, "q.xmodel", "d", None)
    assert p.parse_args(["zoo", "resnet18", "--export", "d"]).output == "d"


def test_compile_takes_the_model_once(capsys):
    assert main(["compile", "a.xmodel", "-x", "b.xmodel", "--target", "B512", "-o", "d"]) == 2
    assert "give the model once" in capsys.readouterr().err
    assert main(["compile", "--target", "B512", "-o", "d"]) == 2
    assert "-x MODEL" in capsys.readouterr().err


def test_zoo_knows_the_sweeps_names(capsys, tmp_path):
    """Every zoo:NAME the sweep's parser knows, with @S and @HxW sizes, is a zoo name; an unknown one is refused
    with the sweep's message."""
    from opendpu.quant import zoo
    from opendpu.runtime.sweep.spec import SweepError, parse_model
    for n in ("digits",) + zoo.NAMES:
        parse_model(f"zoo:{n}")                                   # the sweep knows it ...
    assert main(["zoo", "digits", "resnet18@64", "squeezenet@64x96", "-o", str(tmp_path)]) == 0     # ... and zoo
    out = capsys.readouterr().out
    assert "1x3x64x64" in out and "1x3x64x96" in out and "digits" in out
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == ["digits.onnx", "resnet18.onnx", "squeezenet.onnx"]
    with pytest.raises(SweepError) as e:
        parse_model("zoo:resnet18@12")
    assert main(["zoo", "resnet18@12"]) == 2
    assert str(e.value) in capsys.readouterr().err
    assert main(["zoo", "vgg11"]) == 2 and "unknown zoo model 'vgg11'" in capsys.readouterr().err


def test_one_engine_colour_map_for_every_figure(tmp_path):
    """The profile figure's lanes and per-layer bars and the roofline's points take their colour from one map."""
    import matplotlib.colors as mc

    import os

    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime import plots
    from opendpu.runtime.profile import profile_graph
    path = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "dpu_mnist_classifier.xmodel")
    if not os.path.isfile(path):
        pytest.skip("shared models not present")
    prof = profile_graph(Graph.load(path))
    seen: dict[str, set] = {}
    for fig in (plots.roofline_figure(prof),):
        for ax in fig.axes:
            for c in ax.collections:
                gid = c.get_gid() or ""
                if gid.startswith("roofline-point:"):
                    seen.setdefault(gid.split(":", 1)[1], set()).add(mc.to_hex(c.get_facecolor()[0]))
    assert seen, "no roofline point"
    for engine, colours in seen.items():
        assert colours == {plots.ENGINE_COLORS.get(engine, plots.NO_ENGINE_COLOR)}, (engine, colours)
