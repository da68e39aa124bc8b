"""bench/bench_scale.py's ``--fit-lengths`` projection: a stage's CPU fitted as a x rows + b x tokens through two
parts of different mean lengths, then taken to the full set's rows and tokens, the packers' recipe once."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_scale():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_scale_under_test", ROOT / "bench" / "bench_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fig(cpu: float, rows: int, tokens: int, recipe: float = 0.0) -> dict[str, float]:
    return {"cpu": cpu + recipe, "rows": rows, "tokens": tokens, "nnls_cpu": 0.0, "recipe_cpu": recipe}


def test_fit_recovers_a_linear_cost_and_projects_it(bench_scale, capsys) -> None:
    a, b = 1.5e-6, 8e-9  # CPU-s a row, a token
    ra, ta = 185_595, 185_595 * 404  # the sample text's rows
    rb, tb = 469_883, 469_883 * 170  # --short_seq_prob 1.0
    ea, eb = 0.2, 0.3  # the eval pick: 10,000 rows whatever the size, counted once (the mean)
    ka, kb = 60.0, 80.0  # the packers' recipe: once, the mean of the two
    fig_a = {"nvidia_4320": _fig(a * ra + b * ta, ra, ta), "nvidia_eval": _fig(ea, ra, ta),
             "nvidia_packed": _fig(2 * (a * ra + b * ta), ra, ta, ka)}
    fig_b = {"nvidia_4320": _fig(a * rb + b * tb, rb, tb), "nvidia_eval": _fig(eb, rb, tb),
             "nvidia_packed": _fig(2 * (a * rb + b * tb), rb, tb, kb)}
    out = bench_scale.fit_projection(fig_a, fig_b)
    full = a * bench_scale.FULL_ROWS + b * bench_scale.FULL_TOKENS
    assert out["nvidia-varlength"] == pytest.approx((full + (ea + eb) / 2) / 3600, rel=1e-9)
    assert out["nvidia-packed"] == pytest.approx((2 * full + (ka + kb) / 2 + (ea + eb) / 2) / 3600, rel=1e-9)
    text = capsys.readouterr().out
    assert "a =  1.500 us a row, b =  8.000 ns a token" in text
    # the fit lies between the two parts' bounds (by rows and by tokens) when the cost is linear
    lo = min(fig_a["nvidia_4320"]["cpu"] * bench_scale.FULL_TOKENS / ta,
             fig_b["nvidia_4320"]["cpu"] * bench_scale.FULL_ROWS / rb)
    hi = max(fig_a["nvidia_4320"]["cpu"] * bench_scale.FULL_ROWS / ra,
             fig_b["nvidia_4320"]["cpu"] * bench_scale.FULL_TOKENS / tb)
    assert lo <= full <= hi


def test_fit_with_equal_mean_lengths_falls_back_to_the_rows_scale(bench_scale) -> None:
    f = _fig(1.0, 1000, 256_000)
    out = bench_scale.fit_projection({"nvidia_4320": f}, {"nvidia_4320": dict(f)})
    assert out["nvidia-varlength"] == pytest.approx(1.0 * bench_scale.FULL_ROWS / 1000 / 3600)


def test_the_2048_shuffles_md5s_count_at_the_4320_shuffles_speed(bench_scale, capsys) -> None:
    """One part cut into v1.1's 2,048 shards is ~2 files, hashed in 2 lanes; a full-size gather hashes ~7 side by
    side. Its md5s are counted at the 4,320 shuffle's speed where that is faster, and never made slower."""
    def fig(cpu: float, md5: float, nbytes: int) -> dict:
        return {"cpu": cpu, "costs": {"md5_cpu": md5, "md5_bytes": nbytes}}

    figures = {"nvidia_4320_shuffled": fig(1.2, 0.15, 300_000_000), "nvidia_2048_shuffled": fig(1.6, 0.30, 300_000_000)}
    bench_scale._md5_at_full_size(figures)
    assert figures["nvidia_2048_shuffled"]["cpu"] == pytest.approx(1.6 - 0.15)
    assert "counted at nvidia_4320_shuffled's 2,000 MB/s" in capsys.readouterr().out
    figures = {"nvidia_4320_shuffled": fig(1.2, 0.30, 300_000_000), "nvidia_2048_shuffled": fig(1.6, 0.15, 300_000_000)}
    bench_scale._md5_at_full_size(figures)
    assert figures["nvidia_2048_shuffled"]["cpu"] == 1.6  # already the faster: left as measured
    bench_scale._md5_at_full_size({"nvidia_2048_shuffled": fig(1.6, 0.3, 1)})  # no 4,320 figure: nothing to do


def test_the_2048_shuffles_floor_hashes_at_the_4320_floors_speed(bench_scale, capsys) -> None:
    """The floors' md5s (every output file in one call) get the same correction: ~2 files hash in 2 lanes."""
    def fig(md5: float) -> dict:
        return {"cpu": 1.0, "bytes": 300_000_000, "costs": {"md5_cpu": 0.1, "md5_bytes": 300_000_000},
                "floor": {"read": 0.1, "write": 0.1, "md5": md5, "cpu": 0.2 + md5}}

    figures = {"nvidia_4320_shuffled": fig(0.15), "nvidia_2048_shuffled": fig(0.40)}
    bench_scale._md5_at_full_size(figures)
    assert figures["nvidia_2048_shuffled"]["floor"]["md5"] == pytest.approx(0.15)
    assert figures["nvidia_2048_shuffled"]["floor"]["cpu"] == pytest.approx(0.35)
    figures = {"nvidia_4320_shuffled": fig(0.40), "nvidia_2048_shuffled": fig(0.15)}
    bench_scale._md5_at_full_size(figures)
    assert figures["nvidia_2048_shuffled"]["floor"]["cpu"] == pytest.approx(0.35)  # never made slower


def test_the_projection_prints_each_targets_floor(bench_scale, capsys) -> None:
    """Per target, what reading, writing and hashing its bytes alone costs at full size: the floor's CPU scaled
    as the stage's (the eval pick once); no floor where a stage of the target has none."""
    rows = 185_595
    f = {"cpu": 2.0, "rows": rows, "tokens": rows * 256, "nnls_cpu": 0.0, "recipe_cpu": 0.0, "bytes": 1,
         "floor": {"read": 0.1, "write": 0.2, "md5": 0.2, "cpu": 0.5}}
    bench_scale.target_projection({"nvidia_4320_shuffled": f, "nvidia_packed": {**f, "floor": None}}, None)
    out = capsys.readouterr().out
    want = 0.5 * bench_scale.FULL_ROWS / rows / 3600
    line = next(ln for ln in out.splitlines() if "--target nvidia-4320 " in ln and "by rows" in ln)
    assert f"+{2.0 * bench_scale.FULL_ROWS / rows / 3600:.2f} core-hours" in line
    assert line.endswith(f"its floor (reading, writing and hashing its bytes alone) +{want:.2f}")
    packed = next(ln for ln in out.splitlines() if "--target nvidia-packed " in ln and "by rows" in ln)
    assert "floor" not in packed


def test_the_projection_from_the_dags_stage_seconds_scales_a_part_and_adds_the_once_costs(bench_scale,
                                                                                         capsys) -> None:
    """From the DAG's target pass: a part's seconds scaled as the CPU is (by rows, by tokens), plus what runs once
    a run (the packers' recipe, the eval pick); the 2,048 chop counted at the 4,320 chop's seconds."""
    rows, tokens = 185_595, 185_595 * 400
    f = {"cpu": 2.0, "rows": rows, "tokens": tokens, "nnls_cpu": 0.0, "recipe_cpu": 0.0, "bytes": 1}
    dag = {"nvidia_4320_shuffled": {"per_part": 1.5, "once": 0.0}, "nvidia_eval": {"per_part": 0.0, "once": 0.4},
           "nvidia_packed": {"per_part": 2.0, "once": 70.0}, "nvidia_4320": {"per_part": 1.0, "once": 0.0}}
    bench_scale.target_projection({"nvidia_4320_shuffled": f, "nvidia_eval": f, "nvidia_packed": f,
                                   "nvidia_4320": f}, None, dag=dag)
    out = capsys.readouterr().out

    def line(target: str, basis: str) -> str:
        return next(ln for ln in out.splitlines() if f"--target {target} " in ln and f"by {basis}" in ln)

    by_rows, by_tokens = bench_scale.FULL_ROWS / rows, bench_scale.FULL_TOKENS / tokens
    assert line("nvidia-4320", "rows").endswith(f"from the DAG's stage seconds +{(1.5 * by_rows + 0.4) / 3600:.2f}")
    assert line("nvidia-4320", "tokens").endswith(
        f"from the DAG's stage seconds +{(1.5 * by_tokens + 0.4) / 3600:.2f}")
    assert line("nvidia-packed", "rows").endswith(
        f"from the DAG's stage seconds +{(2.0 * by_rows + 70.4) / 3600:.2f}")
    assert line("nvidia-2048-varlength", "rows").endswith(
        f"from the DAG's stage seconds +{(1.0 * by_rows + 0.4) / 3600:.2f}")
    assert "DAG" not in line("habana-packed", "rows")  # no stage of it in the DAG's pass: nothing said


def test_the_gzip_share_leaves_out_each_runs_recipe_and_md5s(bench_scale) -> None:
    """The gzip's CPU is the gzip run less the uncompressed run, each without its own recipe (whose NNLS CPU moves
    by seconds between runs) and its md5s."""
    gz = {"cpu": 55.0 + 17.5, "recipe_cpu": 55.0, "nnls_cpu": 54.6, "costs": {"md5_cpu": 0.05}}
    raw = {"cpu": 66.2 + 2.3, "recipe_cpu": 66.2, "nnls_cpu": 65.8, "costs": {"md5_cpu": 0.25}}
    assert bench_scale.gzip_share(gz, raw) == pytest.approx((17.5 - 0.05) - (2.3 - 0.25))
    assert bench_scale.gzip_share(raw, gz) == 0.0  # never negative


def test_the_fit_prints_each_targets_floor_fitted_alike(bench_scale, capsys) -> None:
    """With floors in both parts' figures, each target's floor is fitted as its cost is (a x rows + b x tokens)."""
    a, b = 0.5e-6, 2e-9
    ra, ta, rb, tb = 185_595, 185_595 * 404, 469_883, 469_883 * 170

    def fig(rows: int, tokens: int) -> dict:
        return {**_fig(3 * (a * rows + b * tokens), rows, tokens), "floor": {"cpu": a * rows + b * tokens}}

    bench_scale.fit_projection({"nvidia_4320": fig(ra, ta)}, {"nvidia_4320": fig(rb, tb)})
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "--target nvidia-varlength" in ln)
    floor = (a * bench_scale.FULL_ROWS + b * bench_scale.FULL_TOKENS) / 3600
    assert line.endswith(f"; its floor, fitted alike, +{floor:.2f}")
    assert f"fitted +{3 * floor:.2f} core-hours" in line


def test_median_run_reports_the_middle_run_besides_the_recipe_and_lists_every_run(bench_scale) -> None:
    # the packers' recipe (once at full size) is left out when runs are ranked: the run with the largest CPU in
    # all (a slow recipe) is not the slowest run besides it
    runs = [_fig(1.40, 10, 100, recipe=60.0), _fig(1.10, 10, 100, recipe=75.0), _fig(1.90, 10, 100, recipe=58.0)]
    pick = bench_scale.median_run(runs)
    assert pick["cpu"] == pytest.approx(61.40)
    assert pick["runs"] == pytest.approx([1.40, 1.10, 1.90])
    assert "runs" not in runs[0]  # the runs' own figures are left as they were
    # an even count: the lower of the middle two; one run: itself
    assert bench_scale.median_run(runs[:2])["cpu"] == pytest.approx(76.10)
    assert bench_scale.median_run(runs[2:])["runs"] == pytest.approx([1.90])
    with pytest.raises(ValueError):
        bench_scale.median_run([])


def test_marginal_projection_takes_a_process_once_cost_off_and_keeps_the_recipe(bench_scale, capsys) -> None:
    """``--marginal-parts``: a stage's CPU on N and M parts = fixed + per-row x rows; the projection from the growth
    alone is per-row x the full set's rows plus the packers' recipe once, the fixed cost printed apart."""
    per_row, fixed, recipe = 1.1e-6, 0.9, 50.0
    rows_n, rows_m = 4 * 185_595, 8 * 185_595
    fig_n = {"nvidia_packed": _fig(fixed + per_row * rows_n, rows_n, rows_n * 404, recipe)}
    fig_m = {"nvidia_packed": _fig(fixed + per_row * rows_m, rows_m, rows_m * 404, recipe)}
    bench_scale.marginal_projection(fig_n, fig_m)
    out = capsys.readouterr().out
    assert "+0.90 CPU-s once a process" in out
    want = (per_row * bench_scale.FULL_ROWS + recipe) / 3600
    line = next(x for x in out.splitlines() if "--target nvidia-packed" in x and "by rows" in x)
    assert f"+{want:.2f} core-hours" in line, line
    # today's projection from N parts alone counts the fixed cost 500/4 times over: higher
    naive = ((fixed + per_row * rows_n) * bench_scale.FULL_ROWS / rows_n + recipe) / 3600
    assert naive > want + 0.02


def test_disk_ceiling_measures_reads_writes_and_both_and_leaves_no_file(bench_scale, tmp_path) -> None:
    got = bench_scale.disk_ceiling(tmp_path, 16)
    assert not list(tmp_path.iterdir())
    if got is None:  # a file system without O_DIRECT (tmpfs)
        return
    assert set(got) == {"write", "read", "mixed"} and all(v > 0 for v in got.values())


def test_each_stage_is_projected_at_its_own_rows_whichever_stage_comes_first(bench_scale, capsys) -> None:
    """The eval pick reports fewer rows than the parts the packer read (8 hard links of one part): listed first, it
    once set the scale of every stage (8x too high). Each stage is scaled by its own rows and tokens; the recipe
    and the eval pick counted once."""
    part = 185_595
    packed = {"cpu": 44.5, "rows": 8 * part, "tokens": 8 * part * 404, "nnls_cpu": 40.1, "recipe_cpu": 41.1,
              "bytes": 1}
    pick = {"cpu": 0.09, "rows": part, "tokens": part * 404, "nnls_cpu": 0.0, "recipe_cpu": 0.0, "bytes": 1}
    bench_scale.target_projection({"nvidia_eval": pick, "nvidia_packed": packed}, None)
    out = capsys.readouterr().out

    def line(basis: str) -> str:
        return next(ln for ln in out.splitlines() if "--target nvidia-packed " in ln and f"by {basis}" in ln)

    by_rows = ((44.5 - 41.1) * bench_scale.FULL_ROWS / (8 * part) + 41.1 + 0.09) / 3600
    by_tokens = ((44.5 - 41.1) * bench_scale.FULL_TOKENS / (8 * part * 404) + 41.1 + 0.09) / 3600
    assert f"+{by_rows:.2f} core-hours" in line("rows")
    assert f"+{by_tokens:.2f} core-hours" in line("tokens")
    assert f"this part: {8 * part:,} rows" in out
