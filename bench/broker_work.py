"""Which broker processes did the work between two instants: reductions per kind of process
(its initial call: ``rabbit_channel:init/1``, ``rabbit_prequeue:init/1`` for a queue, ...),
summed, with how many processes of the kind and the largest heap among them.

``mark`` keeps every process's reduction count in the broker (the ``rabbit`` application's
environment, read back by ``since``): two ``rabbitmqctl eval`` calls, nothing running in
between, so it costs the broker nothing while the measured step runs.
"""

from __future__ import annotations

import re

from tools import infra

_KEY = "bench_reductions"
_MARK = (
    f"application:set_env(rabbit, {_KEY}, maps:from_list([{{P, R}} || P <- erlang:processes(),"
    " {reductions, R} <- [erlang:process_info(P, reductions)]])), ok."
)
_SINCE = (
    f"{{ok, S0}} = application:get_env(rabbit, {_KEY}), application:unset_env(rabbit, {_KEY}),"
    " Kinds = lists:foldl(fun(P, Acc) ->"
    "   case {erlang:process_info(P, reductions), erlang:process_info(P, total_heap_size)} of"
    "     {{reductions, R}, {total_heap_size, H}} ->"
    "       K = proc_lib:translate_initial_call(P), D = R - maps:get(P, S0, 0),"
    "       maps:update_with(K, fun({D0, N0, H0}) -> {D0 + D, N0 + 1, max(H0, H)} end, {D, 1, H}, Acc);"
    "     _ -> Acc end end, #{}, erlang:processes()),"
    " Top = lists:sublist(lists:reverse(lists:keysort(2, [{K, D, N, H} || {K, {D, N, H}} <- maps:to_list(Kinds)])), 8),"
    " [lists:flatten(io_lib:format('kind ~p reductions=~b processes=~b max_heap_words=~b', [K, D, N, H]))"
    "  || {K, D, N, H} <- Top]."
)
_KIND = re.compile(r"kind \{(\w+),(\w+),(\d+)\} reductions=(-?\d+) processes=(\d+) max_heap_words=(\d+)")


def mark(rabbit: infra.RabbitNode) -> None:
    rabbit.ctl("eval", _MARK, timeout=60)


def since(rabbit: infra.RabbitNode) -> list[dict[str, object]]:
    """The eight kinds of process that did the most reductions since ``mark``."""
    return [
        {
            "process": f"{m}:{f}/{a}",
            "reductions": int(r),
            "processes": int(n),
            "max_heap_mib": round(int(h) * 8 / 2**20, 1),
        }
        for m, f, a, r, n, h in _KIND.findall(rabbit.ctl("eval", _SINCE, timeout=60))
    ]
