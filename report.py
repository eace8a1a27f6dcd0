"""Tables over many evaluations, in the paper's layout: sweeps with their selected runs, sequential
stages, relearning.

    python report.py table OUT.md [NAME=]EVAL_DIR ... [--examples M1-direct ...]
    python report.py stages OUT.md [NAME=]SEQUENTIAL_EVAL ... [--joint NAME=EVAL_DIR ...]
    python report.py relearn OUT.md NAME=BEFORE_EVAL,AFTER_EVAL ...
    python report.py proximity OUT.md METHOD=UNLEARNED_EVAL ARM_EVAL ... [METHOD=...]   # relearning arms
    python report.py lkf OUT.md NAME=LKF_TRAINED_LKF_EVAL,LKF_TRAINED_SUITE_EVAL,SUITE_TRAINED_SUITE_EVAL ...
    python report.py flags OUT.selected              # the train.py flags of a selected run (run_all.sh)
    python report.py agree ROWS.jsonl [--judge heuristic|rules|http ...]   # a judge against ROWS' verdicts
    python report.py rejudge EVAL_DIR ... [--judge heuristic|rules]      # today's offline judge, in place, rescored
    python report.py sample OUT.jsonl EVAL_DIR ... [--root RUNS/small]   # a labelling sample for the judge, split by run
    python report.py packet SAMPLE.jsonl PACKET.jsonl                    # what an annotator sees of it
    python report.py merge OUT.jsonl SAMPLE.jsonl A=LABELS.jsonl B=... C=...   # the labelled set: majority verdicts

An EVAL_DIR is an evaluate.py output folder (metrics.json, rows.jsonl); a SEQUENTIAL_EVAL the folder
evaluate.py wrote for a sequential run (RUN/eval, one subfolder per stage). Every table names its judge.
`agree` re-judges a judged rows.jsonl (any judge: the heuristic, a server) and compares the verdicts per
rubric (agreement, recall and precision of YES) and the fact-level metrics (evaluate.compute_metrics).
"""
import argparse
import collections
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

import data
import evaluate
import judge

COLUMNS = ["Q_D+I", "Q_R", "Q_All", "Q*_All", "Gib", "Retain", "s0", "s1-10", "s11-15", "MMLU", "Rep"]
# The selection rule of the small-scale reproduction: among runs that forget (Q_All <= 10) without
# gibberish (Gib <= 5), the one that retains most; if none qualifies, the best Retain - Q_All - Gib.
MAX_Q_ALL, MAX_GIB = 10.0, 5.0


def entry(arg):
    """[NAME=]EVAL_DIR: the evaluation's metrics and the training settings evaluate.py recorded in them."""
    label, _, folder = arg.rpartition("=")
    folder = Path(folder)
    if not (folder / "metrics.json").exists():
        raise data.UserError(f"{folder}: no metrics.json (evaluate it first)")
    metrics = json.loads((folder / "metrics.json").read_text())
    run = metrics.get("run") or {}
    return {"label": label or run.get("method") or folder.name, "dir": folder, "metrics": metrics, "run": run,
            "method": run.get("method"), "lr": run.get("lr"), "alpha": alpha_range(run), "named": bool(label)}


def alpha_range(run):
    """JensUn++'s balancing factor alpha over training (eq. 4): 'min-median-max' from the run's
    log.jsonl, or None for runs without one."""
    log = Path(run.get("dir", "")) / "log.jsonl"
    if run.get("method") != "jensunpp" or not log.is_file():
        return None
    values = [r["alpha"] for r in map(json.loads, log.read_text().splitlines())
              if r.get("stage") == run.get("stage") and "alpha" in r]
    return f"{min(values):.2g}-{statistics.median(values):.2g}-{max(values):.2g}" if values else None


def values(e):
    avg, u = e["metrics"]["average"], e["metrics"]["utility"]
    return {**avg, "MMLU": u.get("mmlu"), "Rep": u.get("rep")}


def qualifies(e):
    """Whether a run meets the selection rule; a run whose judge failed (evaluate.judge_warnings: its numbers are
    not results) never does."""
    v = values(e)
    return (not e["metrics"].get("warnings") and v.get("Q_All") is not None and v.get("Gib") is not None
            and v["Q_All"] <= MAX_Q_ALL and v["Gib"] <= MAX_GIB)


def select(entries):
    """The selected run of one method's sweep and whether it met the rule (see MAX_Q_ALL, MAX_GIB);
    ties go to the lower learning rate."""
    qualified = [e for e in entries if qualifies(e)]
    if qualified:
        return max(qualified, key=lambda e: (values(e)["Retain"] or 0, -(e["lr"] or 0))), True
    score = lambda e: (values(e).get("Retain") or 0) - (values(e).get("Q_All") or 0) - (values(e).get("Gib") or 0)
    sound = [e for e in entries if not e["metrics"].get("warnings")] or entries
    return max(sound, key=lambda e: (score(e), -(e["lr"] or 0))), False


def settings(e):
    run = e["run"]
    return [f"{run['lr']:.2g}" if run.get("lr") else "", fmt_num(run.get("lambda_f")), fmt_num(run.get("lambda_r")),
            e["alpha"] or ""]


def fmt_num(v):
    return "" if v is None else f"{v:g}"


def row(e, mark=""):
    """A run's table row; each rate with what it left out (undetermined facts, INVALID verdicts: evaluate.cell),
    and a run whose judge failed marked."""
    avg = e["metrics"]["average"]
    cells = [evaluate.cell(avg, c) if c in avg else evaluate.fmt(values(e).get(c)) for c in COLUMNS]
    failed = " (judge failed: not a result)" if e["metrics"].get("warnings") else ""
    return "| " + " | ".join([e["label"] + mark + failed, *settings(e), *cells]) + " |"


def header(entries, title):
    judges = sorted({j for e in entries for j in e["metrics"]["judge"]})
    formats = sorted({f for e in entries for f in e["metrics"].get("prompt_format", ["chat"])})
    head = ["Model", "LR", "lambda_f", "lambda_r", "alpha min-med-max"] + COLUMNS
    return [f"# {title}", "", f"Judge: {', '.join(judges)}; prompt format: {', '.join(formats)}", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]


def sweep_table(args):
    """The paper-layout table: named entries (NAME=EVAL_DIR: base, injected) first, each a row of its own,
    then each method's selected run among the unnamed ones; below it every run of each sweep (selected
    marked *), and example answers of the table's rows. OUT.selected lists the selected evaluation
    folders, one per line."""
    entries = [entry(a) for a in args.evals]
    swept = [e for e in entries if e["method"] and not e["named"]]
    methods = list(dict.fromkeys(e["method"] for e in swept))
    chosen = {m: select([e for e in swept if e["method"] == m]) for m in methods}
    main = [e for e in entries if e not in swept] + [chosen[m][0] for m in methods]
    lines = header(entries, "Results") + [row(e) for e in main]
    unmet = [m for m in methods if not chosen[m][1]]
    if unmet:
        lines += ["", f"No run of {', '.join(unmet)} met the rule (Q_All <= {MAX_Q_ALL:g} and Gib <= {MAX_GIB:g}, "
                  "its judge sound): shown is the best Retain - Q_All - Gib."]
    if any(sum(e["method"] == m for e in swept) > 1 for m in methods):
        lines += ["", f"## Sweeps (selected, marked *: among runs with Q_All <= {MAX_Q_ALL:g} and Gib <= {MAX_GIB:g} "
                  "the highest Retain; if none, the highest Retain - Q_All - Gib)", ""] + header(entries, "")[4:]
        for m in methods:
            runs = sorted((e for e in swept if e["method"] == m),
                          key=lambda e: (e["lr"] or 0, e["run"].get("lambda_f") or 0, e["run"].get("lambda_r") or 0))
            lines += [row(e, " *" if e is chosen[m][0] else "") for e in runs]
    lines += example_answers(main, args.examples)
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".selected").write_text("".join(f"{chosen[m][0]['dir']}\n" for m in methods))
    print("\n".join(lines))


def example_answers(entries, labels):
    """Each model's answer to some forget questions (original wording, asked alone) and its verdict."""
    if not labels:
        return []
    lines = ["", "## Example answers (forget questions, original wording, asked alone)", ""]
    rows_by_entry = [(e, evaluate.read_jsonl_dict(e["dir"] / "rows.jsonl")) for e in entries]
    for label in labels:
        found = [(e, next((r for r in rows.values() if r["set"] == "forget" and r["label"] == label
                           and r["variant"] == "original" and r["format"] == "alone"), None))
                 for e, rows in rows_by_entry]
        first = next((r for _, r in found if r), None)
        if first is None:
            continue
        lines += [f"**{first['question']}** (answer: {first['ground_truth']})", "",
                  "| Model | answer | leaked |", "|---|---|---|"]
        for e, r in found:
            if r:
                text = " ".join(r["answer"].split())[:160].replace("|", "\\|")
                lines.append(f"| {e['label']} | {text} | {r['verdicts'].get('leak', '?')} |")
        lines.append("")
    return lines


def stage_entries(arg):
    """[NAME=]RUN/eval of a sequential run: one entry per stage folder, in the run's stage order."""
    label, _, folder = arg.rpartition("=")
    folder = Path(folder)
    stages = sorted((p for p in folder.iterdir() if (p / "metrics.json").exists() and p.name.startswith("stage")),
                    key=lambda p: int(p.name[len("stage"):].split("_")[0])) if folder.is_dir() else []
    if not stages:
        raise data.UserError(f"{folder}: no stage<N>_<topic>/metrics.json in it (evaluate the sequential run first)")
    return [dict(entry(str(p)), label=label or folder.parent.name, stage=p.name) for p in stages]


def finished(read, args, what):
    """read(arg) for every arg whose evaluation exists; the others as (label, what, problem), so that a
    block's table keeps the runs that finished (one line each for the rest). None finished: an error."""
    done, missing = [], []
    for arg in args:
        try:
            done.append(read(arg))
        except data.UserError as e:
            missing.append((arg.rpartition("=")[0] or Path(arg.split(",")[0]).parent.name, what, str(e)))
    return done, missing


def missing_rows(missing, width):
    for label, what, problem in missing:
        print(f"report.py: left out: {problem}", file=sys.stderr)
    return ["| " + " | ".join([label, f"{what}: not evaluated"] + [""] * (width - 2)) + " |"
            for label, what, _ in missing]


def stages_table(args):
    """The paper's sequential figure as a table (Q_All of every topic after every stage, with Retain
    and Gib) and as a PNG next to OUT; joint runs' final rows beside. Runs not evaluated get a line
    saying so (stderr names what is missing)."""
    runs, missing = finished(stage_entries, args.sequential, "sequential")
    joint, missing_joint = finished(entry, args.joint, "joint")
    if not runs and not joint:
        raise data.UserError("nothing to tabulate: " + "; ".join(p for _, _, p in missing + missing_joint))
    topics = list((runs[0][0] if runs else joint[0])["metrics"]["topics"])
    head = ["Method", "after stage"] + [f"Q_All {t}" for t in topics] + ["Q_All avg", "Retain", "Gib"]
    lines = header([e for r in runs for e in r] + joint, "Sequential and joint unlearning")[:4] + [
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for stages in runs:
        for e in stages:
            lines.append(stage_row(e, e["label"], e["stage"], topics))
    for e in joint:
        lines.append(stage_row(e, e["label"], "joint (all topics at once)", topics))
    lines += missing_rows(missing + missing_joint, len(head))
    Path(args.out).write_text("\n".join(lines) + "\n")
    if runs:
        plot_stages(runs, topics, Path(args.out).with_suffix(".png"))
    print("\n".join(lines))


def stage_row(e, label, stage, topics):
    m = e["metrics"]
    return "| " + " | ".join([label, stage] + [evaluate.cell(m["topics"][t], "Q_All") for t in topics] +
                             [evaluate.cell(m["average"], k) for k in ("Q_All", "Retain", "Gib")]) + " |"


def plot_stages(runs, topics, path):
    """One panel per method: Q_All of each topic (lines) after each stage (x)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 3.2), squeeze=False, sharey=True)
    for ax, stages in zip(axes[0], runs):
        x = range(1, len(stages) + 1)
        for t in topics:
            ax.plot(x, [e["metrics"]["topics"][t].get("Q_All") for e in stages], marker="o", label=t)
        ax.set_title(stages[0]["label"])
        ax.set_xticks(list(x))
        ax.set_xlabel("after stage")
    axes[0][0].set_ylabel("Q_All (%)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def relearn_table(args):
    """Forget rates before and after a relearning attack (appendix: fine-tuning on retain_train)."""
    for arg in args.pairs:                      # a malformed argument is a mistake, not an unfinished run
        if not arg.rpartition("=")[2].partition(",")[2]:
            raise data.UserError(f"{arg}: give NAME=BEFORE_EVAL,AFTER_EVAL")

    def pair(arg):
        label, _, both = arg.rpartition("=")
        before, _, after = both.partition(",")
        return label, entry(before), entry(after)
    pairs, missing = finished(pair, args.pairs, "relearning")
    if not pairs:
        raise data.UserError("nothing to tabulate: " + "; ".join(p for _, _, p in missing))
    keys = ["Q_D+I", "Q_R", "Q_All", "Retain"]
    head = ["Method"] + [f"{k} before" for k in keys] + [f"{k} after" for k in keys]
    lines = header([e for _, b, a in pairs for e in (b, a)], "Relearning")[:4] + [
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, before, after in pairs:
        lines.append("| " + " | ".join([label or before["label"]] +
                                       [evaluate.cell(e["metrics"]["average"], k) for e in (before, after) for k in keys]) + " |")
    lines += missing_rows(missing, len(head))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# Relearning by semantic proximity: the arms in order of distance from the forget topic (the x axis).
# forget:FACTS arms are read out on the other facts; retain_train is the paper's attack, all bands mixed.
def arm_distance(spec):
    """Sort key and axis label of a relearning arm (--relearn-set): forget facts, then semantic tiers by
    their first tier, then the lexical, syntactic and general-knowledge bands, then the whole retain set."""
    kind, _, arg = spec.partition(":")
    if kind == "forget" or spec == "forget_train":
        return (0, 0 if spec == "forget_train" else 1), "forget (all)" if spec == "forget_train" else f"forget {arg}"
    if kind == "tiers":
        return (1, data.parse_tiers(arg)[0]), "s" + arg
    order = {"lexical": 2, "syntax": 3, "gk": 4, "retain_train": 5}
    return (order.get(spec, 6), 0), {"retain_train": "all retain (paper)", "gk": "GK"}.get(spec, spec)


def proximity_groups(items):
    """NAME=UNLEARNED_EVAL followed by the evaluations of its relearning arms: [(name, entry, [arms])], and
    the evaluations that do not exist yet as (label, what, problem) (a block's table keeps what finished)."""
    groups, missing = [], []
    for item in items:
        if "=" not in item and not groups and not missing:
            raise data.UserError(f"{item}: name the unlearned model's evaluation first (METHOD=EVAL_DIR), then its arms")
        try:
            e = entry(item.partition("=")[2] if "=" in item else item)
        except data.UserError as error:
            missing.append((item.partition("=")[0] if "=" in item else Path(item).parent.parent.name,
                            "unlearned" if "=" in item else "arm", str(error)))
            if "=" in item:
                groups.append(None)                         # its arms have nothing to be compared with
            continue
        if "=" in item:
            groups.append((item.partition("=")[0], e, []))
        elif groups[-1] is not None:
            if not e["run"].get("relearn_set"):
                raise data.UserError(f"{item}: not the evaluation of a relearning run (train.py --method nll --relearn-set)")
            groups[-1][2].append(e)
    groups = [g for g in groups if g is not None]
    if not groups:
        raise data.UserError("nothing to tabulate: " + "; ".join(p for _, _, p in missing))
    return groups, missing


def held_out(arm):
    """The facts an arm is read out on: all but those it trains on (forget:FACTS); all for the others."""
    kind, _, arg = arm["run"]["relearn_set"].partition(":")
    return set(data.parse_facts(arg)) if kind == "forget" and arg else set()


def forget_rows(e):
    """The forget and adversarial rows of one evaluation (its rows.jsonl)."""
    rows = evaluate.read_jsonl_dict(e["dir"] / "rows.jsonl").values()
    return [r for r in rows if r["set"] in ("forget", "adversarial")]


def forget_readout(e, rows, skip):
    """Forget rates of one evaluation (`rows`: its forget_rows) over the facts not in `skip` (its single
    topic), and the mean change of the forget answers' NLL against the model it started from
    (evaluate.py --base-eval; None without)."""
    m = evaluate.topic_metrics([r for r in rows if r["fact"] not in skip])
    path = e["dir"] / "nll" / "nll_records.csv"
    delta = None
    if path.is_file():
        import csv
        recs = [r for r in csv.DictReader(open(path)) if r["set"] == "forget" and r.get("fact") not in skip]
        delta = sum(float(r["nll_after"]) - float(r["nll_before"]) for r in recs) / len(recs) if recs else None
    return {**{k: m[k] for k in ("Q_D", "Q_D+I", "Q_R", "Q_All")}, "facts": m["facts"], "dNLL": delta}


def signed(v, digits):
    return "" if v is None else f"{v:+.{digits}f}"


def proximity_table(args):
    """Relearning by semantic proximity: per method and arm, the forget rates after the arm's attack, their
    change against the unlearned model on the same facts, and the change of the forget answers' NLL; a
    PNG beside OUT (change of Q_All and of forget NLL against band distance, one line per method)."""
    groups, missing = proximity_groups(args.evals)
    head = ["Method", "arm (--relearn-set)", "facts read", "Q_D", "Q_D+I", "Q_R", "Q_All", "dQ_All", "d forget NLL"]
    lines = header([e for _, u, arms in groups for e in [u] + arms], "Relearning by semantic proximity")[:4] + [
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    curves = {}
    for name, unlearned, arms in groups:
        unlearned_rows = forget_rows(unlearned)                 # read once, read out on each arm's facts
        base = forget_readout(unlearned, unlearned_rows, set())
        lines.append("| " + " | ".join([name, "none (the unlearned model)", str(base["facts"])] +
                                       [fmt_num(base[k]) for k in ("Q_D", "Q_D+I", "Q_R", "Q_All")] + ["", ""]) + " |")
        for arm in sorted(arms, key=lambda a: arm_distance(a["run"]["relearn_set"])[0]):
            spec, skip = arm["run"]["relearn_set"], held_out(arm)
            after = forget_readout(arm, forget_rows(arm), skip)
            before = forget_readout(unlearned, unlearned_rows, skip)
            dq = None if after["Q_All"] is None or before["Q_All"] is None else after["Q_All"] - before["Q_All"]
            lines.append("| " + " | ".join([name, spec, str(after["facts"])] +
                                           [fmt_num(after[k]) for k in ("Q_D", "Q_D+I", "Q_R", "Q_All")] +
                                           [signed(dq, 1), signed(after["dNLL"], 3)]) + " |")
            curves.setdefault(name, []).append((arm_distance(spec), dq, after["dNLL"]))
    lines += missing_rows(missing, len(head))
    specs = [a["run"]["relearn_set"] for _, _, arms in groups for a in arms]
    if any(data.parse_tiers(spec.partition(":")[2])[1] >= 11 for spec in specs if spec.startswith("tiers:")):
        lines += ["", "Tiers 11-15 come from retain_eval: after their arm those rows are no longer unseen."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    if curves:
        plot_proximity(curves, Path(args.out).with_suffix(".png"))
    print("\n".join(lines))


def plot_proximity(curves, path):
    """Two panels, one line per method: change of Q_All and of the forget answers' NLL per arm, arms
    ordered by distance from the forget topic."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = sorted({point[0] for points in curves.values() for point in points})
    x = {arm: i for i, arm in enumerate(arms)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for name, points in curves.items():
        points = sorted(points)
        for ax, i in zip(axes, (1, 2)):
            ax.plot([x[p[0]] for p in points if p[i] is not None], [p[i] for p in points if p[i] is not None],
                    marker="o", label=name)
    for ax, title in zip(axes, ("change of Q_All (points)", "change of forget answer NLL (nats)")):
        ax.set_xticks(range(len(arms)), [label for _, label in arms], rotation=45, ha="right", fontsize=7)
        ax.axhline(0, color="gray", lw=0.5)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("relearning data, nearest to farthest from the forget topic", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tier_mean(m, low, high):
    """Mean retain rate over semantic tiers low..high (each tier's 25 questions weigh the same)."""
    rates = [v for t, v in m["per_tier"].items() if low <= int(t) <= high and v is not None]
    return round(sum(rates) / len(rates), 1) if rates else None


def lkf_entries(arg):
    """NAME=LKF_TRAINED_LKF_EVAL,LKF_TRAINED_SUITE_EVAL,SUITE_TRAINED_SUITE_EVAL (any may be '-')."""
    name, _, dirs = arg.rpartition("=")
    folders = dirs.split(",")
    if not name or len(folders) != 3:
        raise data.UserError(f"{arg}: give NAME=LKF_TRAINED_LKF_EVAL,LKF_TRAINED_SUITE_EVAL,SUITE_TRAINED_SUITE_EVAL "
                             "('-' for one not run)")
    return name, [None if f == "-" else entry(f) for f in folders]


def lkf_tables(args):
    """The paper's two LKF* tables and the lexical probe (appendix "Comparing evaluation and unlearning
    between LKF* and SUITE", "Benign questions"): models trained on LKF* under both evaluations
    (tab:challenger_combined_expand_llama3b); LKF*-trained against SUITE-trained under SUITE's evaluation
    (tab:challenger_comparison_llama3b); answers to the 'Challenger' probe by kind."""
    rows = [lkf_entries(a) for a in args.runs]
    topic = lambda e: next(iter(e["metrics"]["topics"].values()))
    cell = lambda e, key: evaluate.cell(topic(e), key) if e else ""
    tiers = lambda e, lo, hi: fmt_num(tier_mean(topic(e), lo, hi)) if e else ""
    everything = [e for _, es in rows for e in es if e]
    lines = header(everything, "LKF* against SUITE")[:4]
    head1 = ["Method", "LKF* Q_D", "LKF* s1-5 train", "Q_D+I", "Q_R", "Q_All", "GK", "Syn.", "Lex.", "s0", "s1-5 eval", "s6-15"]
    lines += ["## Trained on LKF*: LKF* evaluation (left) against SUITE's (right)", "",
              "| " + " | ".join(head1) + " |", "|" + "---|" * len(head1)]
    for name, (lkf, lkf_suite, _) in rows:
        lines.append("| " + " | ".join([name, cell(lkf, "Q_D"), cell(lkf, "Retain")] +
                                       [cell(lkf_suite, k) for k in ("Q_D+I", "Q_R", "Q_All", "GK", "Syn", "Lex", "s0")] +
                                       [tiers(lkf_suite, 1, 5), tiers(lkf_suite, 6, 15)]) + " |")
    keys = ["Q_D", "Q_D+I", "Q_R", "Q_All", "Retain"]
    head2 = ["Method"] + [f"LKF*-trained {k}" for k in keys] + [f"SUITE-trained {k}" for k in keys]
    lines += ["", "## Trained on LKF* (left) against trained on SUITE (right), SUITE's evaluation", "",
              "| " + " | ".join(head2) + " |", "|" + "---|" * len(head2)]
    for name, (_, lkf_suite, suite) in rows:
        lines.append("| " + " | ".join([name] + [cell(lkf_suite, k) for k in keys] + [cell(suite, k) for k in keys]) + " |")
    probes = [(name, topic(lkf)["probe"]) for name, (lkf, _, _) in rows if lkf and "probe" in topic(lkf)]
    if probes:
        head3 = ["Method"] + [f"{v}: {k}" for v in evaluate.PROBE_VARIANTS for k in ("refusal", "gibberish", "fluent", "right")]
        lines += ["", "## Lexical probe: the questions with 'Challenger' outside the topic, trained on LKF*", "",
                  "| " + " | ".join(head3) + " |", "|" + "---|" * len(head3)]
        for name, probe in probes:
            lines.append("| " + " | ".join([name] + [f"{probe[v][k]}/{probe[v]['n']}" for v in evaluate.PROBE_VARIANTS
                                                     for k in ("refusal", "gibberish", "fluent", "knows")]) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def train_flags(args):
    """`--lr X --lambda-f Y --lambda-r Z` of the run a `table` command selected (first line of OUT.selected)."""
    path = Path(args.selected)
    if not path.is_file() or not path.read_text().split():
        raise data.UserError(f"{path}: no selected run (run `report.py table` over the sweep first)")
    run = entry(path.read_text().split()[0])["run"]
    if not run.get("method"):
        raise data.UserError(f"{path}: the selected evaluation records no training settings")
    print(f"--lr {run['lr']:g} --lambda-f {run['lambda_f']:g} --lambda-r {run['lambda_r']:g}")


# Agreement with a known judge: `python report.py agree ROWS.jsonl [--judge heuristic|rules|http ...]`

VERDICT_RUBRIC = {"leak": "forget", "gibberish": "gibberish", "knows": "retain"}  # rows.jsonl verdict -> rubric
UNJUDGED = ("refusal",)     # verdicts no judge gives (the lexical probe's refusal detector): carried over as they are
_ROW_FIELDS = {"topic": str, "set": str, "label": str, "question": str, "ground_truth": str, "answer": str,
               "verdicts": dict}


def read_rows(path):
    """Judged rows in evaluate.py's rows.jsonl schema (_ROW_FIELDS; forget and adversarial rows also name
    their fact and qtype). Bad input raises ValueError naming file, line and field."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            for field, typ in _ROW_FIELDS.items():
                if not isinstance(row.get(field), typ):
                    raise ValueError(f"{path}:{n}: field {field!r} missing or not a {typ.__name__}")
            if row["set"] not in ("forget", "adversarial", "retain", "probe"):
                raise ValueError(f"{path}:{n}: field 'set' must be forget, adversarial, retain or probe, got {row['set']!r}")
            named = isinstance(row.get("fact"), str) and isinstance(row.get("qtype"), str)
            if row["set"] in ("forget", "adversarial") and not named:
                raise ValueError(f"{path}:{n}: field 'fact' or 'qtype' missing on a {row['set']} row")
            if not isinstance(row.get("aliases", []), list):
                raise ValueError(f"{path}:{n}: field 'aliases' must be a list")
            for key, verdict in row["verdicts"].items():
                if key not in (*VERDICT_RUBRIC, *UNJUDGED) or verdict not in ("YES", "NO", judge.INVALID):
                    raise ValueError(f"{path}:{n}: field 'verdicts' has {key!r}: {verdict!r} (expected "
                                     f"{'/'.join((*VERDICT_RUBRIC, *UNJUDGED))}: YES, NO or {judge.INVALID})")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def rejudge(rows, new_judge, progress=None):
    """Copies of the rows with the verdicts of `new_judge` for the same (row, verdict) pairs as the originals.
    progress(name, total) may return a callback taking the number done (evaluate.Progress(...).to)."""
    new = [dict(r, verdicts={k: v for k, v in r["verdicts"].items() if k in UNJUDGED}, judge=new_judge.label)
           for r in rows]
    for key, kind in VERDICT_RUBRIC.items():
        idx = [i for i, r in enumerate(rows) if key in r["verdicts"]]
        if not idx:
            continue
        items = [{"question": rows[i]["question"], "ground_truth": rows[i]["ground_truth"],
                  "answer": rows[i]["answer"], "aliases": rows[i].get("aliases") or [], "topic": rows[i]["topic"]}
                 for i in idx]
        verdicts = new_judge.verdicts(kind, items, progress=progress(f"judge {key}", len(idx)) if progress else None)
        for i, v in zip(idx, verdicts):
            new[i]["verdicts"][key] = v
    return new


def recall_precision(confusion):
    """(recall, precision) of YES in % from a {(reference, new): count} confusion: the share of the
    reference's YES the new judge finds, and of the new judge's YES the reference shares (None where
    there is none to count)."""
    yy, yn, ny = (confusion.get(p, 0) for p in (("YES", "YES"), ("YES", "NO"), ("NO", "YES")))
    return (100 * yy / (yy + yn) if yy + yn else None), (100 * yy / (yy + ny) if yy + ny else None)


def agreement(reference, new):
    """Per verdict key: rows compared (reference verdict valid), agreed, confusion {(ref, new): count}."""
    out = {}
    for key in VERDICT_RUBRIC:
        pairs = [(r["verdicts"][key], n["verdicts"][key]) for r, n in zip(reference, new)
                 if key in r["verdicts"] and r["verdicts"][key] != judge.INVALID]
        if pairs:
            confusion = {}
            for p in pairs:
                confusion[p] = confusion.get(p, 0) + 1
            out[key] = {"rows": len(pairs), "agree": sum(a == b for a, b in pairs), "confusion": confusion,
                        "reference_invalid": sum(r["verdicts"].get(key) == judge.INVALID for r in reference)}
    return out


def disagreements(reference, new):
    """Disagreeing (verdict, reference, new, ground truth, answer) groups, the most frequent first."""
    groups = {}
    for r, n in zip(reference, new):
        for key, v in r["verdicts"].items():
            if v != judge.INVALID and n["verdicts"][key] != v:
                g = (key, v, n["verdicts"][key], r["ground_truth"], " ".join(r["answer"].split()))
                groups.setdefault(g, []).append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


FACT_METRICS = ("Q_All", "Q_D+I", "Gib", "Retain")


def sample_metrics(rows):
    """FACT_METRICS over labelled rows that sample a model's answers: Q_All and Q_D+I are the shares of the facts
    (a model's: run, stage, topic, fact) with a labelled query of those kinds of which any query leaked (forget and
    adversarial rows never mix: adversarial rows are left out), Gib the share of forget answers judged gibberish,
    Retain of retain answers still known; INVALID verdicts are left out, a share with nothing to count is None."""
    def facts_known(kinds):
        facts = {}
        for r in rows:
            if r["set"] == "forget" and r.get("qtype") in kinds and r["verdicts"].get("leak") in ("YES", "NO"):
                key = (r.get("run"), r.get("stage"), r["topic"], r["fact"])
                facts[key] = facts.get(key, False) or r["verdicts"]["leak"] == "YES"
        return evaluate.pct(sum(facts.values()), len(facts))

    def share(rows_set, key):
        judged = [r["verdicts"][key] for r in rows if r["set"] == rows_set and r["verdicts"].get(key) in ("YES", "NO")]
        return evaluate.pct(judged.count("YES"), len(judged))

    return {"Q_All": facts_known({"direct", "indirect", "reverse"}), "Q_D+I": facts_known({"direct", "indirect"}),
            "Gib": share("forget", "gibberish"), "Retain": share("retain", "knows")}


def jointly_judged(reference, new):
    """Both judges' rows with only the verdicts both gave (YES or NO): a verdict INVALID on either side is left out
    of both, so that metrics from the two sides count the same rows."""
    ref_out, new_out = [], []
    for r, n in zip(reference, new):
        keys = [k for k, v in r["verdicts"].items() if v in ("YES", "NO") and n["verdicts"].get(k) in ("YES", "NO")]
        ref_out.append(dict(r, verdicts={k: r["verdicts"][k] for k in keys}))
        new_out.append(dict(n, verdicts={k: n["verdicts"][k] for k in keys}))
    return ref_out, new_out


def fact_gaps(reference, new):
    """Per evaluated model (the rows' "run" and "stage", as report.py sample writes them) and over all of them:
    sample_metrics from the reference verdicts and from the new judge's, over the same labelled rows (the verdicts
    both gave: jointly_judged). [(name, {metric: (reference, new)})], the pooled line last; [] for rows that name
    no run."""
    reference, new = jointly_judged(reference, new)
    groups = {}
    for r, n in zip(reference, new):
        if "run" in r:
            groups.setdefault(f"{r['run']} {r.get('stage', 'final')}", []).append((r, n))
    if not groups:
        return []
    out = []
    for name, pairs in sorted(groups.items()) + [("all labelled rows", list(zip(reference, new)))]:
        ref_m, new_m = (sample_metrics([p[i] for p in pairs]) for i in (0, 1))
        out.append((name, {k: (ref_m[k], new_m[k]) for k in FACT_METRICS}))
    return out


def print_fact_gaps(gaps, out):
    """The per-model table of fact_gaps and its largest gap (pooled line aside)."""
    out("")
    out("Fact-level metrics per evaluated model (reference / new, over its labelled rows):")
    out("")
    out("| model | " + " | ".join(FACT_METRICS) + " | largest gap |")
    out("|---|" + "---|" * (len(FACT_METRICS) + 1))
    for name, m in gaps:
        gap = max((abs(a - b) for a, b in m.values() if a is not None and b is not None), default=0.0)
        cells = [f"{evaluate.fmt(a)} / {evaluate.fmt(b)}" for a, b in m.values()]
        out(f"| {name} | " + " | ".join(cells) + f" | {gap:.1f} |")
    per_model = [(abs(a - b), name, k) for name, m in gaps[:-1] for k, (a, b) in m.items()
                 if a is not None and b is not None]
    if per_model:
        gap, name, k = max(per_model)
        out(f"largest gap of one model: {gap:.1f} points ({k}, {name})")


def agree(path, new_judge, show=15, progress=None, out=print):
    """Re-judge a judged rows file with `new_judge` and print the agreement per verdict, the fact-level metrics
    of both judges side by side (evaluate.compute_metrics) and the most frequent disagreements. A labelled set
    (rows with a "split", report.py sample) is reported half by half, the held-out half first: only its figures
    count as the judge's accuracy on answers its rules were not tuned on."""
    reference = read_rows(path)
    t0 = time.time()
    new = rejudge(reference, new_judge, progress)
    seconds = time.time() - t0
    ref_label = ", ".join(sorted({str(r.get("judge", "?")) for r in reference}))
    out(f"{path}: {len(reference)} rows; reference judge: {ref_label}; new judge: {new_judge.label} ({seconds:.2f} s)")
    halves = sorted({r.get("split") for r in reference}, key=lambda h: (h != "heldout", str(h)))
    if halves == [None]:
        return {**agree_tables(reference, new, show, out), "rows": new, "seconds": seconds}
    result = {"rows": new, "seconds": seconds}
    for half in halves:
        pairs = [(r, n) for r, n in zip(reference, new) if r.get("split") == half]
        out("")
        tuned = " (in-sample: rules tuned on it)" if half == "tune" else ""
        out(f"## The {'held-out' if half == 'heldout' else half} half: {len(pairs)} rows of "
            f"{len({r.get('run') for r, _ in pairs})} runs{tuned}")
        result[half] = agree_tables([r for r, _ in pairs], [n for _, n in pairs], show, out)
    return result


def agree_tables(reference, new, show, out):
    """agree's tables for one set of rows: the agreement per verdict, the fact-level metrics over the verdicts both
    judges gave (jointly_judged), per evaluated model where the rows name one (fact_gaps), the disagreements."""
    agreed = agreement(reference, new)
    out("")
    out("| verdict (rubric) | rows | agree % | YES recall % | YES precision % | YES/YES | YES/NO | NO/YES | NO/NO "
        "| new INVALID |")
    out("|---|---|---|---|---|---|---|---|---|---|")
    for key, a in agreed.items():
        c = a["confusion"]
        invalid = sum(n for (_, v), n in c.items() if v == judge.INVALID)
        counts = " | ".join(str(c.get(p, 0)) for p in (("YES", "YES"), ("YES", "NO"), ("NO", "YES"), ("NO", "NO")))
        recall, precision = ("--" if v is None else f"{v:.1f}" for v in recall_precision(c))
        left_out = f" ({a['reference_invalid']} reference INVALID left out)" if a["reference_invalid"] else ""
        out(f"| {key} ({VERDICT_RUBRIC[key]}) | {a['rows']} | {100 * a['agree'] / a['rows']:.2f} | {recall} | "
            f"{precision} | {counts} | {invalid} |{left_out}")
    out("(pairs are reference/new)")
    ref_m, new_m = (evaluate.compute_metrics(rows) for rows in jointly_judged(reference, new))
    out("")
    out(f"Fact-level metrics over the verdicts both judges gave, average over {len(ref_m['topics'])} topic(s) "
        "(evaluate.compute_metrics):")
    out("")
    out("| metric | reference | new | new - reference |")
    out("|---|---|---|---|")
    for k in evaluate.AVERAGED:
        r, n = ref_m["average"][k], new_m["average"][k]
        if r is None and n is None:
            continue
        diff = f"{n - r:+.1f}" if r is not None and n is not None else "--"
        out(f"| {k} | {evaluate.fmt(r)} | {evaluate.fmt(n)} | {diff} |")
    gaps = fact_gaps(reference, new)
    if gaps:
        print_fact_gaps(gaps, out)
    groups = disagreements(reference, new)
    if show and groups:
        out("")
        out(f"Most frequent disagreements ({sum(len(g) for _, g in groups)} rows in {len(groups)} groups; "
            f"top {min(show, len(groups))}):")
        for (key, ref_v, new_v, gt, answer), members in groups[:show]:
            out(f"  {len(members):4d}x {key}: reference {ref_v}, new {new_v} | ground truth: {gt} | answer: "
                f"{answer[:100]} | e.g. {members[0].get('id', members[0]['question'][:60])}")
    return {"agreement": agreed, "reference_metrics": ref_m, "new_metrics": new_m, "disagreements": groups,
            "fact_gaps": gaps}


# ----------------------------------------------------------------------------------------------
# A labelled set for the judge: answers sampled from many runs, split by run

# Per evaluated model (a run's stage), how many distinct answers of each kind to draw (forget asked alone or with context, adversarial, retain).
SAMPLE_QUOTA = {("forget", "alone"): 6, ("forget", "context"): 2, ("adversarial", "alone"): 2, ("retain", "alone"): 4}


def run_of(eval_dir, root):
    """(run, stage) of an evaluation folder below `root` ('seq/npo-sequential/eval/stage2_x' -> ('seq/npo-sequential',
    'stage2_x')): the training run is the path before its evaluation folder (eval/, or eval_NAME/ as evaluate.py
    names its LKF* one: stage 'NAME/final'), the stage what follows it; an evaluation folder directly under `root`
    (eval_base) is a run of its own."""
    parts = Path(eval_dir).resolve().relative_to(Path(root).resolve()).parts
    at = next((i for i, p in enumerate(parts) if i and (p == "eval" or p.startswith("eval_"))), len(parts))
    stage = "/".join(parts[at + 1:]) or "final"
    return "/".join(parts[:at]), (parts[at][5:] + "/" + stage if at < len(parts) and parts[at] != "eval" else stage)


def half_of(run, seed=0):
    """A run's half of the labelled set, "tune" or "heldout", from a hash of its name alone: a run keeps its half
    when other runs join the sample later (a split by position in a list would move some)."""
    return ("tune", "heldout")[int(hashlib.sha256(f"{seed}-{run}".encode()).hexdigest(), 16) % 2]


def sample_rows(eval_dirs, root, seed=0, quota=SAMPLE_QUOTA):
    """A labelling sample: from every evaluated model (a run's stage: fact_gaps compares each), for each kind of
    row in `quota`, that many distinct answers drawn at random (one row per distinct answer, so that a model's one
    refusal is one item, not hundreds); each item keeps its row and gains "run", "stage" and "split": the run's half
    (half_of), so that a run (all its stages) never spans both halves and keeps its half as the sample grows."""
    by_model = {}
    for d in eval_dirs:
        run, stage = run_of(d, root)
        for r in read_rows(Path(d) / "rows.jsonl"):
            by_model.setdefault((run, stage), []).append(dict(r, run=run, stage=stage))
    split = {run: half_of(run, seed) for run, _ in by_model}
    out = []
    for (run, stage), rows in sorted(by_model.items()):
        rng = random.Random(f"{seed}-{run}-{stage}")
        for (name, fmt), n in quota.items():
            pool = [r for r in rows if r["set"] == name and r.get("format", "alone") == fmt]
            rng.shuffle(pool)
            distinct = {}
            for r in pool:
                distinct.setdefault(" ".join(r["answer"].split()), r)
            chosen = list(distinct.values())[:n]
            out += [dict(r, split=split[run], verdicts={k: judge.INVALID for k in r["verdicts"]}) for r in chosen]
    return out


def write_jsonl(path, rows):
    """Whole or not at all: written beside, then renamed over `path` (rejudge rewrites a kept rows.jsonl in place)."""
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def sample_command(args):
    """`report.py sample`: write the labelling sample (rows with INVALID verdicts, to be labelled) to OUT."""
    try:
        rows = sample_rows(args.evals, args.root, seed=args.seed)
    except (ValueError, OSError) as e:          # a bad rows.jsonl line, a folder outside --root
        raise data.UserError(str(e)) from None
    write_jsonl(args.out, rows)
    halves = {h: sum(r["split"] == h for r in rows) for h in ("tune", "heldout")}
    models, runs = len({(r["run"], r["stage"]) for r in rows}), len({r["run"] for r in rows})
    print(f"{args.out}: {len(rows)} items from {models} evaluated models of {runs} runs ({halves['tune']} tune, "
          f"{halves['heldout']} held out)")
    for kind in sorted({r["run"].split("/")[0] for r in rows}):      # the folder under --root: sweep, seq, ...
        of_kind = {r["run"]: r["split"] for r in rows if r["run"].split("/")[0] == kind}
        print(f"  {kind}: {sum(h == 'tune' for h in of_kind.values())} runs tune, "
              f"{sum(h == 'heldout' for h in of_kind.values())} held out")


def item_key(row):
    """An item's id in annotators' files: opaque (a hash of its row id, run and stage), so that no method or run
    name shows."""
    return hashlib.sha256(f"{row['id']}|{row['run']}|{row['stage']}".encode()).hexdigest()[:12]


def packet_command(args):
    """`report.py packet`: the annotators' view of a sample: per item only what the paper's judge sees (question,
    ground truth, response) and the labels to give (its verdict keys), in a seeded order that hides runs."""
    try:
        rows = read_rows(args.sample)
    except (ValueError, OSError) as e:
        raise data.UserError(str(e)) from None
    order = list(range(len(rows)))
    random.Random(f"{args.seed}-packet").shuffle(order)
    write_jsonl(args.out, [{"id": item_key(r), "labels": sorted(r["verdicts"]), "question": r["question"],
                            "ground_truth": r["ground_truth"], "response": r["answer"]} for r in (rows[i] for i in order)])
    print(f"{args.out}: {len(rows)} items")


def merge_labels(rows, annotations):
    """The sample's rows with each annotator's labels ("labels": {name: {key: YES|NO}}) and their majority as the
    verdicts; the pairwise agreement of the annotators per verdict key. `annotations`: {name: (path, {item id:
    record with its '_line'})}, an odd number of annotators (no ties). An item an annotator left out, or a label
    other than YES or NO, is an error naming the file, its line and the field."""
    if len(annotations) % 2 == 0:
        raise ValueError(f"merge: {len(annotations)} annotators; give an odd number, so that a majority never ties")
    out = []
    for r in rows:
        key = item_key(r)
        labels = {}
        for name, (path, given) in annotations.items():
            if key not in given:
                raise ValueError(f"{path}: item {key} missing (annotator {name}; it needs {sorted(r['verdicts'])})")
            for k in r["verdicts"]:
                if given[key].get(k) not in ("YES", "NO"):
                    raise ValueError(f"{path}:{given[key]['_line']} field {k!r}: {given[key].get(k)!r}, expected "
                                     f"YES or NO (annotator {name}, item {key})")
            labels[name] = {k: given[key][k] for k in r["verdicts"]}
        votes = {k: sum(l[k] == "YES" for l in labels.values()) for k in r["verdicts"]}
        majority = {k: "YES" if 2 * v > len(labels) else "NO" for k, v in votes.items()}
        out.append(dict(r, labels=labels, verdicts=majority, judge=f"annotators (majority of {len(labels)})"))
    names = list(annotations)
    pairs = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for k in VERDICT_RUBRIC:
                both = [(r["labels"][a][k], r["labels"][b][k]) for r in out if k in r["verdicts"]]
                if both:
                    pairs[(a, b, k)] = (sum(x == y for x, y in both), len(both))
    return out, pairs


def read_annotations(specs):
    """NAME=PATH (or PATH: its file name without suffix) per annotator -> {name: (path, {item id: record})}. Two
    annotators of one name, or an item twice in one file, are errors naming the file (and line)."""
    annotations = {}
    for spec in specs:
        name, _, path = spec.rpartition("=")
        name = name or Path(path).stem
        if name in annotations:
            raise ValueError(f"{path}: a second annotator named {name!r} (give each file NAME=PATH)")
        by_id = {}
        for a in data.read_jsonl(path):                   # a bad line: an error naming file and line
            if not isinstance(a.get("id"), str):
                raise ValueError(f"{path}:{a['_line']} field 'id': missing (the packet item's id)")
            if a["id"] in by_id:
                raise ValueError(f"{path}:{a['_line']} field 'id': item {a['id']} again (first on line "
                                 f"{by_id[a['id']]['_line']})")
            by_id[a["id"]] = a
        annotations[name] = (path, by_id)
    return annotations


def merge_command(args):
    """`report.py merge`: the labelled set from the sample and the annotators' files (NAME=PATH)."""
    try:
        annotations = read_annotations(args.annotations)
        rows, pairs = merge_labels(read_rows(args.sample), annotations)
    except (ValueError, OSError) as e:
        raise data.UserError(str(e)) from None
    write_jsonl(args.out, rows)
    print(f"{args.out}: {len(rows)} items labelled by {', '.join(annotations)}")
    for (a, b, k), (agree, n) in pairs.items():
        print(f"  {a} vs {b}, {k}: {100 * agree / n:.1f}% of {n}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("table", help="sweeps: one selected run per method, the whole sweep, example answers")
    t.add_argument("out")
    t.add_argument("evals", nargs="+", metavar="[NAME=]EVAL_DIR")
    t.add_argument("--examples", nargs="*", default=["M1-direct", "K5-direct", "K8-direct"],
                   help="forget labels whose answers the table shows")
    s = sub.add_parser("stages", help="sequential runs stage by stage (table and PNG), joint runs beside")
    s.add_argument("out")
    s.add_argument("sequential", nargs="+", metavar="[NAME=]RUN/eval")
    s.add_argument("--joint", nargs="*", default=[], metavar="[NAME=]EVAL_DIR")
    r = sub.add_parser("relearn", help="forget rates before and after relearning")
    r.add_argument("out")
    r.add_argument("pairs", nargs="+", metavar="NAME=BEFORE_EVAL,AFTER_EVAL")
    x = sub.add_parser("proximity", help="relearning arms by semantic proximity (table and PNG)")
    x.add_argument("out")
    x.add_argument("evals", nargs="+", metavar="METHOD=UNLEARNED_EVAL ARM_EVAL ...",
                   help="each method's unlearned evaluation, then the evaluations of its relearning arms")
    k = sub.add_parser("lkf", help="the LKF* tables: LKF*-trained under both evaluations, LKF*- against SUITE-trained")
    k.add_argument("out")
    k.add_argument("runs", nargs="+", metavar="NAME=LKF_TRAINED_LKF_EVAL,LKF_TRAINED_SUITE_EVAL,SUITE_TRAINED_SUITE_EVAL")
    f = sub.add_parser("flags", help="the train.py flags of the run a table selected")
    f.add_argument("selected", metavar="OUT.selected")
    m = sub.add_parser("sample", help="a labelling sample for the judge: distinct answers of many runs, split by run")
    m.add_argument("out")
    m.add_argument("evals", nargs="+", metavar="EVAL_DIR")
    m.add_argument("--root", default="runs/small", help="the block's folder: runs are named by their path below it")
    m.add_argument("--seed", type=int, default=0)
    w = sub.add_parser("packet", help="the annotators' view of a sample: question, ground truth, response, labels to give")
    w.add_argument("sample")
    w.add_argument("out")
    w.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("merge", help="the labelled set: a sample, its annotators' labels and their majority")
    g.add_argument("out")
    g.add_argument("sample")
    g.add_argument("annotations", nargs="+", metavar="NAME=LABELS.jsonl")
    a = sub.add_parser("agree", help="re-judge the answers of a judged rows.jsonl and compare the verdicts")
    a.add_argument("rows", help="a judged rows.jsonl (evaluate.py's schema)")
    a.add_argument("--judge", choices=["heuristic", "rules", "http"], default="heuristic",
                   help="heuristic: the offline judge; rules: the same without the coherence model; http: a server")
    a.add_argument("--judge-url", default="http://127.0.0.1:8000/v1")
    a.add_argument("--judge-model", default=None, help="default: the model the server lists")
    a.add_argument("--judge-concurrency", type=int, default=16)
    a.add_argument("--judge-timeout", type=float, default=60.0, help="seconds a judge request may take")
    a.add_argument("--cache", default=None, help=f"verdict cache of the http judge (default {judge.DEFAULT_CACHE})")
    a.add_argument("--show", type=int, default=15, help="how many disagreement groups to list")
    j = sub.add_parser("rejudge", help="judge evaluations' rows.jsonl again with the offline judge, in place, and rescore")
    j.add_argument("evals", nargs="+", metavar="EVAL_DIR")
    j.add_argument("--judge", choices=["heuristic", "rules"], default="heuristic")
    return p.parse_args(argv)


def rejudge_command(args):
    """`report.py rejudge EVAL_DIR ...`: each evaluation's rows.jsonl judged again by the offline judge (in place:
    kept archives follow the judge), its metrics.json and report.md recomputed (evaluate.rescore); prints the
    verdicts that moved, per evaluation and in all."""
    new_judge, moved_in_all = judge.make_judge(args.judge), collections.Counter()
    for eval_dir in args.evals:
        path = Path(eval_dir) / "rows.jsonl"
        try:
            rows = read_rows(path)
        except (ValueError, OSError) as e:
            raise data.UserError(str(e)) from None
        again = rejudge(rows, new_judge)
        moved = collections.Counter(f"{key} {old['verdicts'][key]} -> {new['verdicts'][key]}"
                                    for old, new in zip(rows, again) for key in VERDICT_RUBRIC
                                    if key in old["verdicts"] and old["verdicts"][key] != new["verdicts"][key])
        moved_in_all.update(moved)
        write_jsonl(path, again)
        evaluate.rescore(eval_dir)
        print(f"{eval_dir}: {len(rows)} rows; moved: {dict(moved) or 'none'}", flush=True)
    print(f"all {len(args.evals)}: moved: {dict(moved_in_all) or 'none'}")


def agree_command(args):
    """`report.py agree`: the judge the flags name against the verdicts of ROWS.jsonl."""
    new = judge.make_judge(args.judge, url=args.judge_url, model=args.judge_model, cache_path=args.cache,
                           concurrency=args.judge_concurrency, timeout=args.judge_timeout)
    progress = (lambda name, total: evaluate.Progress(name, total).to) if args.judge == "http" else None
    try:
        agree(args.rows, new, show=args.show, progress=progress)
    except (ValueError, OSError) as e:          # a malformed or missing rows file
        raise data.UserError(str(e)) from None


def main(argv=None):
    with data.one_line_errors("report.py", judge.ServerUnavailable):
        args = parse_args(argv)
        {"table": sweep_table, "stages": stages_table, "relearn": relearn_table, "proximity": proximity_table,
         "lkf": lkf_tables, "flags": train_flags, "agree": agree_command, "sample": sample_command,
         "packet": packet_command, "merge": merge_command, "rejudge": rejudge_command}[args.command](args)


if __name__ == "__main__":
    main()
