"""``fallback=auto`` for the table search: choose the fallback by its *searched* table.

At primitive granularity the fallback decides more than the table: on Lattice-LSTM the
heuristic with the fewest batches alone (critical path) ends with a searched table 14% worse
than type-wise greedy's searched table on unseen graphs. :func:`search_fallbacks` therefore
searches a table for every candidate fallback and keeps the one whose table needs the fewest
batches on the validation graphs, at a bounded cost (a short probe per candidate, the full
search for the best few).

The score is an estimate of the final ratio on unseen graphs that spends the few held-out
graphs only where they are needed: the fallback alone is no fitted thing, so its ratio is
measured on every graph at hand (training and validation, ``whole``); the table's relative
gain over it is fitted, so it is measured on the validation graphs alone. Ranking by the
validation graphs alone (two mini-batches in the main job) picked
``replay:typewise_greedy_backward`` on Lattice-LSTM cells, 1.1% ahead of critical path there
but 2.5% behind it on the 18 training and 1.5% behind on the 5 test mini-batches.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from edbatch.errors import ConfigError
from edbatch.graph import Graph
from edbatch.schedule import lower_bound
from envs.encoding import StateKey
from policies.q_learning import AUTO_FALLBACKS, select_fallback
from policies.table_search import SearchStats, search_table, table_batches

__all__ = ["FallbackChoice", "estimate", "resolve_fallback", "search_fallbacks"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FallbackChoice:
    """What :func:`search_fallbacks` chose: the fallback, its searched table, that table's
    validation batches and search stats, and per candidate its validation batches
    (``bare``: the fallback alone, ``probe``: after the short search, ``searched``: after the
    full search, finalists only, else None; ``best``: the fewest of them, its score) and
    the candidate tables it scored (``evaluations``)."""

    fallback: str
    table: dict[StateKey, int]
    batches: int
    stats: SearchStats
    scores: dict[str, dict[str, int | None]]
    lb: int
    """The validation graphs' lower bound."""
    whole_lb: int = 0
    """The lower bound of the training and validation graphs together (``whole``)."""

    def ratios(self) -> dict[str, dict[str, float | int | None]]:
        """Per candidate its validation batches / LB (``bare_ratio``, ``probe_ratio``,
        ``searched_ratio``) and ``evaluations``: JSON-ready, for the policy's metadata."""
        lb = max(self.lb, 1)
        return {name: {**{f"{k}_ratio": None if row[k] is None else int(row[k] or 0) / lb
                          for k in ("bare", "probe", "searched")},
                       "whole_ratio": int(row.get("whole") or 0) / max(self.whole_lb, 1),
                       "estimate": estimate(row, self.whole_lb),
                       "evaluations": row["evaluations"]}
                for name, row in self.scores.items()}


def estimate(row: dict[str, int | None], whole_lb: int) -> float:
    """A candidate's score: its fallback's ratio on the training and validation graphs
    (``whole``) times its table's relative gain on the validation graphs
    (``best / bare``, at most 1: a table is kept only when it costs no batches)."""
    whole, bare, best = (int(row[k] or 0) for k in ("whole", "bare", "best"))
    return whole / max(whole_lb, 1) * best / max(bare, 1)


def search_fallbacks(candidates: Sequence[str], train: Sequence[Graph], check: Sequence[Graph],
                     val: Sequence[Graph], encoding: str, *, probe_evals: int = 200,
                     finalists: int = 2, sweeps: int = 3, min_visits: int = 1,
                     max_evals: int = 2000) -> FallbackChoice:
    """The fallback whose *searched* table is estimated to need the fewest batches.

    Each candidate fallback gets a short search from the empty table (one sweep of at most
    ``probe_evals`` candidate tables, most visited states first); its score is
    :func:`estimate`: the fallback's ratio alone on ``train`` and ``val`` together, times
    the fewer of its probed table's and its bare fallback's validation batches over the
    latter (a table is kept only when it needs no more than its fallback alone). The best
    ``finalists`` candidates continue the search from their probed table (``sweeps`` more
    sweeps, ``max_evals`` tables in all, probe included) and the best final score wins;
    ties go to the earlier candidate. Probing
    stops once a candidate reaches the validation graphs' lower bound (nothing can beat it).
    Deterministic: the same graphs give the same choice and table.
    """
    names = list(dict.fromkeys(candidates))
    if not names:
        raise ConfigError("candidates", list(candidates), "at least one fallback name",
                          "pass e.g. ['critical_path', 'typewise_greedy']")
    lb = sum(lower_bound(g) for g in val)
    whole_lb = lb + sum(lower_bound(g) for g in train)
    rows: dict[str, dict[str, int | None]] = {}
    found: dict[str, tuple[dict[StateKey, int], SearchStats, int]] = {}
    for name in names:
        bare = table_batches({}, val, encoding, name)
        table, st = search_table({}, train, check, encoding, name, sweeps=1,
                                 min_visits=min_visits, max_evals=min(probe_evals, max_evals))
        probe = table_batches(table, val, encoding, name)
        found[name] = (table, st, probe)
        rows[name] = {"bare": bare, "probe": probe, "searched": None,
                      "best": min(bare, probe), "evaluations": st.evaluations,
                      "whole": bare + table_batches({}, train, encoding, name)}
        if min(bare, probe) <= lb:
            break

    def rank(name: str) -> tuple[float, int]:
        return estimate(rows[name], whole_lb), names.index(name)

    for name in sorted(rows, key=rank)[:max(finalists, 1)]:
        table, st, batches = found[name]
        rest = max_evals - st.evaluations
        if rest > 0 and sweeps > 0 and int(rows[name]["best"] or 0) > lb:
            table, more = search_table(table, train, check, encoding, name, sweeps=sweeps,
                                       min_visits=min_visits, max_evals=rest)
            st = SearchStats(st.sweeps + more.sweeps, st.evaluations + more.evaluations,
                             st.changes + more.changes, more.train_batches, more.check_batches)
            batches = table_batches(table, val, encoding, name)
        found[name] = (table, st, batches)
        rows[name].update(searched=batches, best=min(int(rows[name]["bare"] or 0), batches),
                          evaluations=st.evaluations)
    finals = [n for n in rows if rows[n]["searched"] is not None]
    best = min(finals, key=rank)
    table, st, batches = found[best]
    return FallbackChoice(best, table, batches, st, rows, lb, whole_lb)


def resolve_fallback(name: str, train: Sequence[Graph], check: Sequence[Graph],
                     val: Sequence[Graph], encoding: str, *, probe_evals: int = 200,
                     finalists: int = 2, sweeps: int = 3, min_visits: int = 1,
                     max_evals: int = 2000) -> tuple[str, FallbackChoice | None]:
    """``name`` unless it is ``auto``; then each of :data:`AUTO_FALLBACKS` searched from
    the empty table (:func:`search_fallbacks`, which also returns the winner's table), every
    candidate's validation ratios logged; without a search (``sweeps`` 0) the heuristic
    with the fewest validation batches alone (:func:`~policies.q_learning.select_fallback`).
    """
    if name != "auto":
        return name, None
    if sweeps <= 0:
        fallback = select_fallback(val, encoding)
        log.info("fallback chosen on the validation graphs: %s", fallback)
        return fallback, None
    choice = search_fallbacks(AUTO_FALLBACKS, train, check, val, encoding,
                              probe_evals=probe_evals, finalists=finalists, sweeps=sweeps,
                              min_visits=min_visits, max_evals=max_evals)
    for cand, row in choice.ratios().items():
        searched = row["searched_ratio"]
        log.info("fallback candidate %s: %.4f x LB alone on the training and validation "
                 "graphs; validation %.4f x LB alone, %.4f after the probe%s (%d tables); "
                 "estimate %.4f", cand, row["whole_ratio"], row["bare_ratio"],
                 row["probe_ratio"],
                 "" if searched is None else f", {searched:.4f} after the full search",
                 row["evaluations"], row["estimate"])
    log.info("fallback chosen by its estimate (alone on every graph x its table's "
             "validation gain): %s", choice.fallback)
    return choice.fallback, choice
