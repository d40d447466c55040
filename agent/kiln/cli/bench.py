"""`kiln bench` (a sweep against any endpoint) and `kiln bench compare` (kiln's plan against vanilla vLLM)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kiln import datafiles
from kiln.bench import report, setups
from kiln.bench.capacity import MeasuredCapacity, against_prediction, measure_capacity
from kiln.bench.client import Target, VllmBench, discover
from kiln.bench.predicted import Level, predict_capacity, predict_levels
from kiln.bench.sweep import Slo, SweepSpec, ratios, run_sweep
from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import Choice
from kiln.cli.argtypes import positive_count, positive_number
from kiln.cli.locate import locate
from kiln.cli.output import print_json, table
from kiln.errors import ConfigError, KilnError
from kiln.perf.capacity import streams_ceiling
from kiln.perf.workload import Workload
from kiln.planner.by_capacity import slots
from kiln.render.vllm import MODULE_VLLM, Runtime, find_vllm_python
from kiln.serve.decide import decide
from kiln.serve.layout import ServeLayout
from kiln.setup.types import Refusal
from kiln.wiring import Kiln

DEFAULT_CEILING = 256  # the most streams a capacity search tries without a plan to say how many slots there are


def _concurrencies(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers, e.g. 1,2,4,8")
    return values


def _add_sweep(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=_concurrencies, default=(1, 2, 4, 8, 16, 32, 64),
                   help="concurrent requests per level (default: 1,2,4,8,16,32,64)")
    p.add_argument("--input-len", type=positive_count, default=512)
    p.add_argument("--output-len", type=positive_count, default=256)
    p.add_argument("--dataset", choices=["random", "sharegpt"], default="random")
    p.add_argument("--dataset-path", help="the ShareGPT JSON file, with --dataset sharegpt")
    p.add_argument("--num-prompts", type=positive_count, help="prompts per level (default: 8 per concurrent request)")
    p.add_argument("--slo-ttft-ms", type=positive_number, default=Slo.ttft_ms,
                   help="goodput: time to first token at most")
    p.add_argument("--slo-tpot-ms", type=positive_number, default=Slo.tpot_ms,
                   help="goodput: time per output token at most")
    price = p.add_mutually_exclusive_group()
    price.add_argument("--price-per-hour", type=positive_number, help="USD per hour of the machine")
    price.add_argument("--machine", help="a machine fixture whose DigitalOcean price applies (`kiln detect --list`)")
    p.add_argument("--out", type=Path, default=Path("kiln-bench"), help="folder for results.json, report.md, plots")
    p.add_argument("--vllm-python", help="the Python with vLLM for the benchmark client (default: found)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def add_arguments(_name: str, bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--url", help="the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000")
    bench.add_argument("--api-key", help="the endpoint's key (`kiln status` shows it)")
    bench.add_argument("--cacert", type=Path, help="the certificate an HTTPS endpoint is checked against (default: "
                                                   "kiln's own when the URL is this machine's, else the system's)")
    bench.add_argument("--tokenizer", help="the model's tokenizer, a folder or Hub id (default: the endpoint's "
                                           "model, or this machine's kiln agent's model folder)")
    bench.add_argument("--state-dir", type=Path,
                       help="this machine's kiln agent's folder, for its certificate and model (default: the running "
                            "agent's)")
    bench.add_argument("--predict", metavar="PROFILE",
                       help="print kiln's prediction beside each level: the plan for PROFILE on --machine's "
                            "fixture (the CPU profile: this machine)")
    bench.add_argument("--predict-instances", type=positive_count, help="the instances the predicted plan serves with")
    bench.add_argument("--capacity", action="store_true",
                       help="instead of the levels: the most streams the endpoint carries within the budget "
                            "(--slo-ttft-ms, --slo-tpot-ms, at p90), doubling then bisecting; with --predict, "
                            "beside the engine's capacity and its band")
    bench.add_argument("--capacity-ceiling", type=positive_count,
                       help="the most streams a capacity search tries (default: the predicted plan's batch slots "
                            "and a quarter, else 256)")
    _add_sweep(bench)
    modes = bench.add_subparsers(dest="mode")
    compare = modes.add_parser("compare", help="kiln's plan against vanilla vLLM on this machine, side by side")
    compare.add_argument("--profile", default="tiny-cpu", help="the profile both setups serve (default: tiny-cpu)")
    compare.add_argument("--instances", type=positive_count, help="kiln's instances (default: the plan's)")
    _add_sweep(compare)


def price(args: argparse.Namespace) -> tuple[float | None, str]:
    """The hourly price and where it came from."""
    if args.price_per_hour is not None:
        return args.price_per_hour, "command line"
    if not args.machine:
        return None, "not given: pass --price-per-hour or --machine"
    droplets = datafiles.read_yaml("droplets.yaml")
    for slug, size in droplets["sizes"].items():
        if size.get("fixture") == args.machine and size.get("usd_per_hour") is not None:
            return float(size["usd_per_hour"]), f"{slug}, {droplets['source']} (as of {droplets['as_of']})"
    raise ConfigError(f"no DigitalOcean price for the machine {args.machine!r}",
                      fix="pass --price-per-hour, or a fixture with an on-demand price (`kiln detect --list`)")


def _spec(args: argparse.Namespace) -> SweepSpec:
    if args.dataset == "sharegpt" and not args.dataset_path:
        raise ConfigError("--dataset sharegpt needs --dataset-path FILE", fix="give the ShareGPT JSON file")
    return SweepSpec(args.concurrency, args.input_len, args.output_len, args.dataset, args.dataset_path,
                     args.num_prompts, Slo(args.slo_ttft_ms, args.slo_tpot_ms))


class ProgressBar:
    """One line per level; redrawn in place on a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int, level: dict[str, Any] | None) -> None:
        bar = "#" * round(20 * done / total) + "." * (20 - round(20 * done / total))
        last = (f"  concurrency {level['concurrency']}: {level['output_tokens_per_s']:,.1f} tok/s, "
                f"TTFT p50 {level['ttft_ms']['p50']:,.0f} ms") if level else "  running..."
        line = f"{self.label} [{bar}] {done}/{total}{last}"
        if self.tty:
            print(f"\r{line:<110}", end="" if done < total else "\n", file=sys.stderr, flush=True)
        elif level:
            print(line, file=sys.stderr, flush=True)
        if level and level.get("failed"):
            print(f"kiln bench: {level['failed']} request(s) failed at concurrency {level['concurrency']}: "
                  + " | ".join(level.get("errors") or ["no reason recorded"]), file=sys.stderr, flush=True)


def _sweep(target: Target, spec: SweepSpec, client: VllmBench, usd: float | None, label: str,
           env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return run_sweep(spec, lambda workload: client.run(target, workload, env), usd, ProgressBar(label))


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def local_endpoint(url: str, state_dir: Path) -> tuple[str | None, str | None]:
    """kiln's own certificate (to pin) and its model's folder (the tokenizer), when the URL is this machine's kiln
    agent; None for what is not found."""
    if urlsplit(url).hostname not in LOOPBACK:
        return None, None
    layout = ServeLayout(state_dir=state_dir)
    certificate = layout.tls_dir / "self-signed.crt"
    cacert = str(certificate) if url.startswith("https://") and certificate.is_file() else None
    tokenizer = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        for process in json.loads(layout.runtime_file.read_text(encoding="utf-8"))["processes"]:
            argv = list(process["argv"])
            if "--model" in argv and Path(argv[argv.index("--model") + 1]).is_dir():
                tokenizer = argv[argv.index("--model") + 1]
                break
    return cacert, tokenizer


def cmd_bench(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.mode == "compare":
        return cmd_compare(kiln, args)
    if not args.url:
        raise ConfigError("kiln bench needs --url", fix="e.g. --url http://127.0.0.1:8000 (or `kiln bench compare`)")
    usd, source = price(args)
    spec = _spec(args)
    cacert, tokenizer = None, None
    if urlsplit(args.url).hostname in LOOPBACK:  # this machine's agent: its certificate and its model's folder
        agent = locate(args.state_dir)
        print(agent.said(), file=sys.stderr)
        cacert, tokenizer = local_endpoint(args.url, agent.state_dir)
    target = discover(args.url.rstrip("/"), args.api_key, str(args.cacert) if args.cacert else cacert,
                      args.tokenizer or tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    client = VllmBench(args.vllm_python or find_vllm_python(), args.out / "vllm-bench.log")
    client.check_tokenizer(target.tokenizer)
    if args.capacity:
        return _capacity(kiln, args, target, client)
    levels = _sweep(target, spec, client, usd, "kiln bench")
    if args.predict:
        _add_predictions(kiln, args, spec, levels)
    setup = {"label": "endpoint", "url": target.base_url, "model": target.model, "dataset": spec.dataset,
             "input_len": spec.input_len, "output_len": spec.output_len, "usd_per_hour": usd,
             "price_source": source, "slo": f"TTFT <= {spec.slo.ttft_ms:g} ms, TPOT <= {spec.slo.tpot_ms:g} ms"}
    files = report.write_sweep(args.out, levels, setup)
    if args.json:
        print_json(json.loads((args.out / "results.json").read_text()))
    else:
        print(report.markdown_table(levels))
        if args.predict:
            print("\n" + predicted_text(levels))
        print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def _capacity(kiln: Kiln, args: argparse.Namespace, target: Target, client: VllmBench) -> int:
    """The endpoint's capacity within the budget, measured, beside the engine's when --predict names the plan."""
    if args.dataset != "random":
        raise ConfigError("--capacity sends random prompts of --input-len and --output-len",
                          fix="drop --dataset, or run the levels without --capacity")
    workload = Workload(args.input_len, args.output_len, ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)
    predicted, ceiling, start = None, args.capacity_ceiling or DEFAULT_CEILING, 1
    if args.predict:
        profile = kiln.profile(args.predict, None)
        machine = kiln.machine(None if profile.cpu_only else args.machine)
        found = predict_capacity(machine, profile, args.predict_instances, workload, kiln.constants)
        if isinstance(found, Refusal):
            raise KilnError(f"no prediction: {found.reason}", fix="; ".join(found.suggestions) or "drop --predict")
        predicted = found
        ceiling = args.capacity_ceiling or streams_ceiling(slots(found.plan))
        start = max(found.capacity.streams, 1)  # the search starts at the prediction: fewer probes
    print(f"kiln bench --capacity: {workload.budget()}, {workload.shape()}; probes up to {ceiling} streams",
          file=sys.stderr, flush=True)

    def said(level: dict[str, Any]) -> None:
        print(f"  {level['concurrency']} streams: TTFT p90 {level['ttft_ms']['p90']:,.0f} ms, TPOT p90 "
              f"{level['tpot_ms']['p90']:,.1f} ms, {level['output_tokens_per_s']:,.1f} tok/s: "
              f"{'within' if level['meets_budget'] else 'over'} the budget", file=sys.stderr, flush=True)

    measured = measure_capacity(workload, lambda argv: client.run(target, argv), ceiling, start, said)
    result: dict[str, Any] = {"endpoint": target.base_url, "model": target.model, "measured": measured.as_dict(),
                              "predicted": None, "side_by_side": None}
    if predicted is not None:
        at = predicted.capacity.at_streams
        result["predicted"] = {"profile": args.predict, "instances": len(predicted.plan.instances),
                               "capacity": predicted.report}
        result["side_by_side"] = against_prediction(measured, predicted.report,
                                                    round(at.requests_per_s, 3) if at else None)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capacity.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print_json(result)
        return 0
    print(capacity_text(measured, result["side_by_side"]))
    print(f"\nwrote {args.out / 'capacity.json'}")
    return 0


def capacity_text(measured: MeasuredCapacity, side: dict[str, Any] | None) -> str:
    at = measured.as_dict()
    if not measured.streams:
        head = f"Measured: not even one stream meets {measured.workload.budget()}"
    else:
        head = (f"Measured: {measured.streams} streams within {measured.workload.budget()}: "
                f"{at['requests_per_s']:,.2f} requests/s, {at['output_tokens_per_s']:,.1f} output tok/s "
                f"({(at['share_within_budget'] or 0) * 100:.0f}% of the requests within both at once)")
    if side is None:
        return head

    def fmt(v: float | None, digits: int = 1) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"

    rows = [[name, fmt(m, 2), fmt(p, 2), f"{fmt(r, 2)}x" if r else "-"]
            for name, (m, p, r) in (("streams", side["streams"]), ("requests/s (those streams)",
                                                                   side["requests_per_s"]),
                                    ("output tok/s", side["output_tokens_per_s"]),
                                    ("TTFT p90 ms", side["ttft_ms_p90"]), ("TPOT p90 ms", side["tpot_ms_p90"]))]
    band = side["band"]
    inside = {True: "inside", False: "outside", None: "no band"}[band["measured_inside"]]
    low, high = band["output_tokens_per_s"] or (None, None)
    return "\n".join([head, "", table(["At capacity", "measured", "predicted", "ratio"], rows), "",
                      f"predicted band of output tok/s: {fmt(low)} to {fmt(high)} ({band['source'] or '-'}); "
                      f"the measured output is {inside} it"])


def _add_predictions(kiln: Kiln, args: argparse.Namespace, spec: SweepSpec, levels: list[dict[str, Any]]) -> None:
    """Each level's prediction: the plan for the profile on this machine, its instances simulated at the level's
    concurrency and prompts."""
    profile = kiln.profile(args.predict, None)
    machine = kiln.machine(None if profile.cpu_only else args.machine)  # the CPU profile runs here
    asked = [Level(spec.input_len, spec.output_len, lv["concurrency"], spec.prompts(lv["concurrency"]))
             for lv in levels]
    predicted = predict_levels(machine, profile, args.predict_instances, asked, kiln.constants)
    if isinstance(predicted, Refusal):
        raise KilnError(f"no prediction: {predicted.reason}", fix="; ".join(predicted.suggestions) or "drop --predict")
    plan, forecasts = predicted
    for level, f in zip(levels, forecasts, strict=True):
        level["predicted"] = {"engine": f.engine, "instances": len(plan.instances),
                              "output_tokens_per_s": round(f.output_tokens_per_s, 1),
                              "ttft_ms_p50": round(f.ttft_ms["p50"], 1), "tpot_ms_p50": round(f.tpot_ms["p50"], 2)}


def predicted_text(levels: list[dict[str, Any]]) -> str:
    rows = []
    for level in levels:
        p = level["predicted"]
        rows.append([level["concurrency"],
                     f"{level['output_tokens_per_s']:,.1f} vs {p['output_tokens_per_s']:,.1f} "
                     f"({level['output_tokens_per_s'] / p['output_tokens_per_s']:.2f}x)",
                     f"{level['ttft_ms']['p50']:,.1f} vs {p['ttft_ms_p50']:,.1f}",
                     f"{level['tpot_ms']['p50']:,.2f} vs {p['tpot_ms_p50']:,.2f}"])
    return table(["Concurrency", "Output tok/s: measured vs predicted", "TTFT p50 ms", "TPOT p50 ms"], rows)


def cmd_compare(kiln: Kiln, args: argparse.Namespace) -> int:
    usd, source = price(args)
    spec = _spec(args)
    args.out.mkdir(parents=True, exist_ok=True)
    client = VllmBench(args.vllm_python or find_vllm_python(), args.out / "vllm-bench.log")
    root = args.out / "setups"  # each setup's state and logs
    # The plan for this machine (--machine only prices it), with kiln up's folder for made models.
    runtime = Runtime(vllm_command=(find_vllm_python(), *MODULE_VLLM), models_dir=str(root / "kiln" / "models"))
    decision = decide(kiln, None, ResolvedChoice(Choice(profile=args.profile, instances=args.instances), {}),
                      runtime)
    if decision.plan is None or decision.profile is None:
        what, fix = decision.failure or ("no plan", "")
        raise KilnError(what, fix=fix)
    profile, machine = decision.profile, decision.machine
    local = profile.local_model
    print(f"1/2 kiln's plan: {len(decision.rendered)} instance(s) of {profile.name} behind kiln's endpoint",
          file=sys.stderr, flush=True)
    first = decision.rendered[0].argv
    model = first[first.index("--model") + 1]
    with setups.kiln_up(root / "kiln", profile.name, instances=len(decision.rendered)) as up:
        ours = _sweep(discover(up.url, up.api_key, up.certificate, model), spec, client, usd, "kiln   ")
    argv = setups.vanilla_argv(model, profile.name, setups.Ports().vanilla, machine.gpu_count if machine else 0,
                               profile.serving.extra_args if profile.cpu_only else (),
                               launcher=runtime.vllm_command)
    print("2/2 vanilla vLLM: one instance, default flags", file=sys.stderr, flush=True)
    # On the CPU backend vLLM's default reserves 92% of the node's memory and will not start beside anything;
    # the KV-cache size is what it needs to start at all, not tuning.
    needs_env = {k: v for k, v in decision.rendered[0].env.items() if k == "VLLM_CPU_KVCACHE_SPACE"}
    with setups.vanilla(root / "vanilla", argv, local, needs_env) as plain:
        baseline = _sweep(Target(plain.url, profile.name, model), spec, client, usd, "vanilla")
    rows = ratios(ours, baseline)
    result = {"profile": profile.name, "usd_per_hour": usd, "price_source": source, "kiln": ours,
              "vanilla": baseline, "ratios": rows, "vanilla_argv": list(argv)}
    (args.out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    report.plot({"kiln": ours, "vanilla vLLM": baseline}, args.out, f"{profile.name}: kiln vs vanilla")
    text = compare_text(ours, baseline, rows)
    (args.out / "compare.md").write_text(f"# kiln vs vanilla vLLM: {profile.name}\n\n{text}\n")
    if args.json:
        print_json(result)
    else:
        print(text)
    return 0


def compare_text(ours: list[dict[str, Any]], baseline: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    def fmt(v: float | None, digits: int = 1) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"

    by_level = {b["concurrency"]: b for b in baseline}
    lines = []
    for k, r in zip(ours, rows, strict=False):
        b = by_level[k["concurrency"]]
        lines.append([k["concurrency"],
                      f"{fmt(k['output_tokens_per_s'])} vs {fmt(b['output_tokens_per_s'])} "
                      f"({fmt(r['output_tokens_per_s'], 2)}x)",
                      f"{fmt(k['ttft_ms']['p50'])} vs {fmt(b['ttft_ms']['p50'])} ({fmt(r['ttft_ms_p50'], 2)}x)",
                      f"{fmt(k['e2e_ms']['p50'])} vs {fmt(b['e2e_ms']['p50'])} ({fmt(r['e2e_ms_p50'], 2)}x)",
                      f"{fmt(k['usd_per_million_output_tokens'], 4)} vs {fmt(b['usd_per_million_output_tokens'], 4)}"
                      f" ({fmt(r['usd_per_million_output_tokens'], 2)}x)"])
    return table(["Concurrency", "Output tok/s: kiln vs vanilla", "TTFT p50 ms", "E2E p50 ms",
                  "$ per M output tokens"], lines)
