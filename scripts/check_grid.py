"""Run the feature grid (mindformers_core/testing/grid.py): every feature x model x data x layout x mode cell on 2
msrun workers in one batched launch, each against the one-process run of its configuration; print the table, the
wall and CPU time; ``--write-docs`` writes it into docs/finetune.md ("Feature grid") and the refused count into
the README.

    python scripts/check_grid.py                                  # the whole grid (long: see docs/finetune.md)
    python scripts/check_grid.py --only model=qwen3,mode=jit      # a filter: key=value, '|' between values
    python scripts/check_grid.py --list                           # the cells and their preflight, nothing run
    python scripts/check_grid.py --merge a.json b.json --write-docs   # tables of separate runs as one

Exit code: 0 when no cell fails, 1 when one does, 2 for bad arguments.
"""
import argparse
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DOC = os.path.join(ROOT, "docs", "finetune.md")
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- grid:begin (scripts/check_grid.py --write-docs) -->", "<!-- grid:end -->"
README_LINE = re.compile(r"(The feature grid \(docs/finetune\.md#feature-grid\)[^\n]*)")


def write_docs(table: str, counts, stamp: str) -> None:
    with open(DOC) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: no '{BEGIN}' ... '{END}' markers (the Feature grid section)")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(DOC, "w") as f:
        f.write(f"{head}{BEGIN}\n{stamp}\n\n{table}\n{END}{tail}")
    with open(README) as f:
        readme = f.read()
    total = sum(counts.values())
    line = (f"The feature grid (docs/finetune.md#feature-grid): {counts['refused']} of {total} cells refused by name, "
            f"{counts['fail']} failing, {counts['pass']} = one process ({time.strftime('%Y-%m-%d', time.gmtime())}).")
    if README_LINE.search(readme):
        readme = README_LINE.sub(line, readme, count=1)
    else:
        raise SystemExit(f"{README}: no line starting 'The feature grid (docs/finetune.md#feature-grid)' to update")
    with open(README, "w") as f:
        f.write(readme)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="filter: key=value[|value],... keys: feature, model, data, layout, mode")
    p.add_argument("--list", action="store_true", help="list the cells and their preflight (refused or to run)")
    p.add_argument("--work", default=None, help="work directory (default: a new temporary one)")
    p.add_argument("--deadline", type=float, default=None, help="seconds a cell may take on the workers")
    p.add_argument("--json", default=None, help="write the outcomes as JSON here")
    p.add_argument("--merge", nargs="+", default=None, help="merge outcome JSON files instead of running")
    p.add_argument("--write-docs", action="store_true", help="write the table into docs/finetune.md and README.md")
    p.add_argument("--logs", action="store_true", help="print the rank logs of failing cells")
    p.add_argument("--note", default="", help="a sentence added to the table's stamp (--write-docs)")
    args = p.parse_args(argv)
    import signal
    # SIGTERM ends this process like Ctrl-C: the exit handlers kill a launch still running (msrun and its workers)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from mindformers_core.testing import grid
    try:
        only = grid.parse_only(args.only)
        selected = grid.cells(only)
    except ValueError as e:
        print(f"check_grid: {e}", file=sys.stderr)
        return 2
    if args.merge:
        outcomes = {}
        for path in args.merge:
            with open(path) as f:
                outcomes.update(grid.from_json(json.load(f)))
        selected = [c for c in grid.cells() if c.name in outcomes]
        stamp = f"_merged from {len(args.merge)} run(s), {time.strftime('%Y-%m-%d', time.gmtime())}_"
    elif args.list:
        import tempfile
        refused, launched, refs = grid.prepare(selected, args.work or tempfile.mkdtemp(prefix="mfc_grid_list_"))
        for c in selected:
            print(f"{'REFUSED ' + refused[c.name] if c.name in refused else 'run':.160s}  {c.name}")
        print(f"{len(selected)} cells: {len(refused)} refused, {len(launched)} to run, {len(refs)} references")
        return 0
    else:
        kwargs = {"deadline": args.deadline} if args.deadline else {}
        run = grid.run_grid(selected, work=args.work, **kwargs)
        outcomes = run.outcomes
        print(f"[grid] wall {run.wall:.0f} s; CPU: the 2 workers {run.worker_cpu:.0f} s, this process "
              f"{run.parent_cpu:.0f} s (one-process references {run.reference_cpu:.0f} s of CPU in "
              f"{run.reference_wall:.0f} s); {run.launches} launch(es)")
        stamp = (f"_{time.strftime('%Y-%m-%d', time.gmtime())}, {len(selected)} cells"
                 f"{' (' + args.only + ')' if args.only else ''}: wall {run.wall:.0f} s, CPU {run.worker_cpu + run.parent_cpu:.0f} s_")
        if args.logs:
            for name, o in outcomes.items():
                if o.status == "fail" and o.logs:
                    print(f"===== {name}: {o.reason}\n{o.logs}")
    print(grid.text_table(selected, outcomes))
    table = grid.markdown(selected, outcomes)
    print()
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(grid.to_json(outcomes), f, indent=1)
    if args.write_docs:
        write_docs(table, grid.summary(outcomes), stamp[:-1] + (f"; {args.note}_" if args.note else "_"))
    return 1 if any(o.status == "fail" for o in outcomes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
