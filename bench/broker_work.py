"""Which broker processes did the work between two instants: reductions per kind of process
(its initial call: ``rabbit_channel:init/1``, ``rabbit_prequeue:init/1`` for a queue, ...),
summed, with how many processes of the kind and the largest heap among them.

``mark`` keeps every process's reduction count in the broker (the ``rabbit`` application's
environment, read back by ``since``): two ``rabbitmqctl eval`` calls, nothing running in
between, so it costs the broker nothing while the measured step runs. The process running
``since``'s own fold is left out (it counted millions of reductions of its own, as
``proc_lib:init_p/5``). A last row gives the node's garbage collections meanwhile: a major
collection of a queue process's heap of a gigabyte is a cost no reduction count shows.
"""

from __future__ import annotations

import re

from tools import infra

_KEY = "bench_reductions"
_MARK = (
    f"application:set_env(rabbit, {_KEY}, maps:from_list([{{gc, erlang:statistics(garbage_collection)}}"
    " | [{P, R} || P <- erlang:processes(), {reductions, R} <- [erlang:process_info(P, reductions)]]])), ok."
)
_SINCE = (
    f"{{ok, S0}} = application:get_env(rabbit, {_KEY}), application:unset_env(rabbit, {_KEY}),"
    " Kinds = lists:foldl(fun(P, Acc) ->"
    "   case {erlang:process_info(P, reductions), erlang:process_info(P, total_heap_size)} of"
    "     {{reductions, R}, {total_heap_size, H}} ->"
    "       K = proc_lib:translate_initial_call(P), D = R - maps:get(P, S0, 0),"
    "       maps:update_with(K, fun({D0, N0, H0}) -> {D0 + D, N0 + 1, max(H0, H)} end, {D, 1, H}, Acc);"
    "     _ -> Acc end end, #{}, erlang:processes() -- [self()]),"
    " Top = lists:sublist(lists:reverse(lists:keysort(2, [{K, D, N, H} || {K, {D, N, H}} <- maps:to_list(Kinds)])), 8),"
    " [lists:flatten(io_lib:format('kind ~p reductions=~b processes=~b max_heap_words=~b', [K, D, N, H]))"
    "  || {K, D, N, H} <- Top]"
    " ++ [begin {G0, W0, _} = maps:get(gc, S0), {G1, W1, _} = erlang:statistics(garbage_collection),"
    " lists:flatten(io_lib:format('gc collections=~b reclaimed_words=~b', [G1 - G0, W1 - W0])) end]."
)
_KIND = re.compile(r"kind \{(\w+),(\w+),(\d+)\} reductions=(-?\d+) processes=(\d+) max_heap_words=(\d+)")
_GC = re.compile(r"gc collections=(\d+) reclaimed_words=(\d+)")


def mark(rabbit: infra.RabbitNode) -> None:
    rabbit.ctl("eval", _MARK, timeout=60)


def since(rabbit: infra.RabbitNode) -> list[dict[str, object]]:
    """The eight kinds of process that did the most reductions since ``mark``, then the
    node's garbage collections."""
    printed = rabbit.ctl("eval", _SINCE, timeout=60)
    kinds: list[dict[str, object]] = [
        {
            "process": f"{m}:{f}/{a}",
            "reductions": int(r),
            "processes": int(n),
            "max_heap_mib": round(int(h) * 8 / 2**20, 1),
        }
        for m, f, a, r, n, h in _KIND.findall(printed)
    ]
    kinds += [
        {"process": "garbage collection (all)", "collections": int(g), "reclaimed_mib": round(int(w) * 8 / 2**20, 1)}
        for g, w in _GC.findall(printed)
    ]
    return kinds
