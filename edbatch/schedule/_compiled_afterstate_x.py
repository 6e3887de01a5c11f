"""Extra afterstate features: a two-step lookahead on the remaining bound, per-type margins.

The afterstate columns of :mod:`edbatch.schedule._compiled_afterstate` look one batch ahead;
these (:data:`EXTRA_FEATURES`, appended to them) read the same arrays (``d``: the most
``down`` per ready type, ``rdn``/``rpres``: what each ready type releases) a little further.
Notation: ``D`` the rows of the ready types now, ``D'`` those after ``a`` runs (the other
ready types' rows and ``R_a``'s), a type is *tight* if its own row's entry on itself beats
every other present row's (running it lowers the remaining lower bound; a tight type stays
tight until it runs).

====================  ==========================================================
``owns``              types ``t != a`` whose longest remaining chain only ``a``'s ready
                      nodes hold (``D[a, t] > D[b, t]`` for every other ready ``b``), ``/ 4``
``miss2``             two-step: the fewest non-tight decisions among the next two after
                      ``a``, over the follow-ups ``b`` ready after ``a``, ``/ 2``
``n_tight2``          two-step: the most tight types after ``a`` then ``b``, ``/ 4``
``margin``            ``min(D[a, a] - max over other ready b of D[b, a], 8) / 8`` if ``a`` is
                      tight, else 0: how far ``a`` leads its own chain
``tight_wait``        1 if ``a`` is not tight now but running another ready type ``b`` first
                      makes it tight (fill if postponed, on the bound)
====================  ==========================================================

The state after ``a`` then ``b`` is approximated with what is tracked: if ``b`` was ready
before ``a`` ran, its release ``R_b`` joins (the nodes waiting on ``a`` and ``b`` together,
and what ``R_a``'s own type-``b`` nodes release, are left out); a type ``R_a`` made ready
releases nothing known. The Python twin (``policies.afterstate.AfterstateTwin``) computes
the same approximation by rescanning; the tests assert identical rows.
"""

from __future__ import annotations

from numba import njit

__all__ = ["EXTRA_FEATURES", "NUM_EXTRA", "check_both", "now_cols", "reset_pairs",
           "two_step"]

EXTRA_FEATURES = ("owns", "miss2", "n_tight2", "margin", "tight_wait")
NUM_EXTRA = len(EXTRA_FEATURES)


@njit(cache=True)
def check_both(todo, ntodo, uptr, uids, pptr, pids, pending, executed, op, batchable, inr,  # noqa: C901
               rdn, rpres, inr2, rdn2, rp2, down):  # type: ignore[no-untyped-def]
    """``_check_users`` of :mod:`edbatch.schedule._compiled_afterstate` and the pair
    releases in one scan of the operands: an unexecuted batchable user ``u`` of the nodes
    ``todo[:ntodo]`` whose pending operands are all ready nodes of one batchable type ``b``
    joins ``R_b`` (``inr[u] = b``, its ``down`` row into ``rdn[b, op[u]]``), of exactly two
    ``a < b`` joins ``R_ab`` (running both releases it: ``inr2[u]``, its row into
    ``rdn2[a * k + b, op[u]]``). A node is put in each once; when ``a`` or ``b`` runs the
    pair's rows are cleared (:func:`reset_pairs`) and its members join ``R_b`` / ``R_a``."""
    k = len(batchable)
    for i in range(ntodo):
        v = todo[i]
        for e in range(uptr[v], uptr[v + 1]):
            u = uids[e]
            if inr[u] >= 0 or pending[u] == 0 or not batchable[op[u]]:
                continue
            a, b = -1, -1
            for f in range(pptr[u], pptr[u + 1]):
                p = pids[f]
                if executed[p]:
                    continue
                t = op[p]
                if pending[p] != 0 or not batchable[t]:
                    a = -2
                    break
                if a < 0 or t == a:
                    a = t
                elif b < 0 or t == b:
                    b = t
                else:
                    a = -2
                    break
            if a < 0:
                continue
            t = op[u]
            if b < 0:
                inr[u] = a
                rpres[a, t] = True
                for m in range(k):
                    if down[u, m] > rdn[a, t, m]:
                        rdn[a, t, m] = down[u, m]
            elif not inr2[u]:
                inr2[u] = True
                q = (a * k + b) if a < b else (b * k + a)
                rp2[q, t] = True
                for m in range(k):
                    if down[u, m] > rdn2[q, t, m]:
                        rdn2[q, t, m] = down[u, m]


@njit(cache=True)
def reset_pairs(a, k, rdn2, rp2):  # type: ignore[no-untyped-def]
    """``a`` ran: the pairs with ``a`` release nothing more together (nothing if the pairs
    are not kept: ``rp2`` empty)."""
    if rp2.shape[0] == 0:
        return
    for b in range(k):
        q = (a * k + b) if a < b else (b * k + a)
        for t in range(k):
            if rp2[q, t]:
                rp2[q, t] = False
                rdn2[q, t, :] = 0


@njit(cache=True)
def _tight_wait(a, k, d, nl, lst, rdn, rpres):  # type: ignore[no-untyped-def]
    """1.0 if running one of the other ready types (``lst[:nl]``) first makes ``a`` tight."""
    for j in range(nl):
        b = lst[j]
        if b == a:
            continue
        own = d[a, a] if d[a, a] > rdn[b, a, a] else rdn[b, a, a]
        best = 0
        for c in range(k):
            x = rdn[b, c, a] if (c != a and rpres[b, c]) else 0
            if x > best:
                best = x
        for jj in range(nl):
            c = lst[jj]
            if c != a and c != b and d[c, a] > best:
                best = d[c, a]
        if own > best:
            return 1.0
    return 0.0


@njit(cache=True)
def _now_cols(r, ids, k, d, nl, lst, rdn, rpres, out, col):  # type: ignore[no-untyped-def]
    """``owns``, ``margin``, ``tight_wait`` of the ready types (``lst[:nl]``, ``present``
    in ``rpres``'s sense: rows of ``d``)."""
    for i in range(r):
        a = ids[i]
        owns = 0
        for t in range(k):
            if t != a and d[a, t] > 0:
                m = 0
                for j in range(nl):
                    b = lst[j]
                    if b != a and d[b, t] > m:
                        m = d[b, t]
                owns += d[a, t] > m
        out[i, col] = owns / 4.0
        margin = d[a, a]
        for j in range(nl):
            if lst[j] != a and d[a, a] - d[lst[j], a] < margin:
                margin = d[a, a] - d[lst[j], a]
        out[i, col + 3] = (margin if margin < 8 else 8) / 8.0 if margin > 0 else 0.0
        wait = _tight_wait(a, k, d, nl, lst, rdn, rpres) if margin <= 0 else 0.0
        out[i, col + 4] = wait


@njit(cache=True)
def _n_tight_list(n, lst, rows):  # type: ignore[no-untyped-def]
    """Tight types among the ``n`` types ``lst`` with the rows ``rows``."""
    nt = 0
    for i in range(n):
        t = lst[i]
        own, win = rows[t, t], True
        for j in range(n):
            if j != i and rows[lst[j], t] >= own:
                win = False
                break
        nt += win and own > 0
    return nt


@njit(cache=True)
def two_step(a, k, d, rlen, batchable, rdn, rpres, rdn2, rp2, dn, la, nla, l2, dn2, nt2):  # type: ignore[no-untyped-def]
    """``(miss2, n_tight2)`` of ready type ``a``: ``dn`` holds the rows after ``a`` of the
    ``nla`` types ``la``; ``l2``, ``dn2``: scratch. Without ``nt2`` (its weight 0) a
    follow-up ``b`` that cannot lower ``miss2`` is skipped (``n_tight2`` is then not
    computed: the same ``miss2``)."""
    miss, best_nt = 2, 0
    for i in range(nla):
        b = la[i]
        tb = dn[b, b] > 0
        for j in range(nla):
            if j != i and dn[la[j], b] >= dn[b, b]:
                tb = False
        if not nt2 and (0 if tb else 1) >= miss:
            continue
        old = rlen[b] > 0 and batchable[b] and b != a  # ready before a: R_b known
        q = (a * k + b) if a < b else (b * k + a)
        n2 = 0
        for t in range(k):
            keep = t != b and _in(t, la, nla)
            both = old and rp2.shape[0] > 0 and rp2[q, t]
            if keep or (old and rpres[b, t]) or both:
                l2[n2] = t
                n2 += 1
        for j in range(n2):
            t = l2[j]
            keep = t != b and _in(t, la, nla)
            for jj in range(n2):
                m = l2[jj]
                x = dn[t, m] if keep else 0
                if old and rdn[b, t, m] > x:
                    x = rdn[b, t, m]
                if old and rp2.shape[0] > 0 and rp2[q, t] and rdn2[q, t, m] > x:
                    x = rdn2[q, t, m]
                dn2[t, m] = x
        ntb = _n_tight_list(n2, l2, dn2)
        mb = (0 if tb else 1) + (1 if (n2 > 0 and ntb == 0) else 0)
        miss = mb if mb < miss else miss
        best_nt = ntb if ntb > best_nt else best_nt
    return (miss if nla > 0 else 0), best_nt


@njit(cache=True, inline="always")
def _in(t, lst, n):  # type: ignore[no-untyped-def]
    for i in range(n):
        if lst[i] == t:
            return True
    return False


@njit(cache=True)
def now_cols(r, ids, k, d, rdn, rpres, out, col):  # type: ignore[no-untyped-def]
    """Write ``owns``, ``margin``, ``tight_wait`` of the ``r`` ready types ``ids`` into
    ``out[:, col:]`` (arrays as :func:`~edbatch.schedule._compiled_afterstate.afterstate_rows`';
    ``miss2``, ``n_tight2`` are its, :func:`two_step`)."""
    _now_cols(r, ids, k, d, r, ids, rdn, rpres, out, col)
