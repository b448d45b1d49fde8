"""Where the broker's time went between two instants, three ways:

* reductions per kind of process (its initial call: ``rabbit_channel:init/1``,
  ``rabbit_prequeue:init/1`` for a queue, ...), summed, with how many processes of the kind and
  the largest heap among them;
* the VM's microstate accounting: seconds its threads spent per state (``scheduler:emulator``,
  ``scheduler:gc``, ``dirty_cpu_scheduler:gc``, ``poll:check_io``, ...; sleep left out).
  Reductions count function calls, not time: the idle minute at 1,000,000 listed about four
  million of them while the broker used 1.3 to 1.6 CPU s, and what one costs varies too much
  to turn one figure into the other. The states are thread time, not CPU: on busy cores they
  include time the OS gave to other processes;
* the collections of one process, traced: the one with the largest heap when measuring starts
  (the start queue's, a gigabyte, with 1,000,000 held), or a queue named (a create from empty
  grows the start queue's heap only while it runs): minor and major collections and the
  seconds they took. A major
  collection (or a hibernation, which compacts the heap) of a gigabyte is a cost the node's
  collection count cannot tell from a thousand small ones.

``mark`` keeps every process's reduction count in the broker (the ``rabbit`` application's
environment, read back by ``since``), resets and starts microstate accounting, and starts a
tracer process: two ``rabbitmqctl eval`` calls, nothing running in between but the tracer
(it receives a message per collection of one process), so it costs the broker next to
nothing while the measured step runs. The process running ``since``'s own fold is left out
(it counted millions of reductions of its own, as ``proc_lib:init_p/5``).
"""

from __future__ import annotations

import re
from collections import defaultdict

from tools import infra

_KEY = "bench_reductions"
_TRACER = "bench_gc_tracer"
# The tracer: counts the traced process's collections and sums their durations
# (monotonic_timestamp: nanoseconds) until asked, then answers and exits.
_TRACE_LOOP = (
    "Loop = fun L(Minor, Major, Ns, Since) -> receive"
    " {trace_ts, _, gc_minor_start, _, T} -> L(Minor + 1, Major, Ns, T);"
    " {trace_ts, _, gc_major_start, _, T} -> L(Minor, Major + 1, Ns, T);"
    " {trace_ts, _, E, _, T} when (E =:= gc_minor_end orelse E =:= gc_major_end), Since =/= none ->"
    "   L(Minor, Major, Ns + T - Since, none);"
    " {report, From} -> From ! {gc_trace, Minor, Major, Ns};"
    " _ -> L(Minor, Major, Ns, Since) end end"
)
_MARK = (
    f"application:set_env(rabbit, {_KEY}, maps:from_list([{{gc, erlang:statistics(garbage_collection)}}"
    " | [{P, R} || P <- erlang:processes(), {reductions, R} <- [erlang:process_info(P, reductions)]]])),"
    " erlang:system_flag(microstate_accounting, reset), erlang:system_flag(microstate_accounting, true),"
    f" case whereis({_TRACER}) of undefined -> ok; Old -> exit(Old, kill) end,"
    f" {_TRACE_LOOP},"
    " Big = {traced},"
    f" Tracer = spawn(fun() -> Loop(0, 0, 0, none) end), register({_TRACER}, Tracer),"
    " erlang:trace(Big, true, [garbage_collection, monotonic_timestamp, {tracer, Tracer}]),"
    ' io:format("traced ~p~n", [proc_lib:translate_initial_call(Big)]), ok.'
)
_LARGEST_HEAP = (
    "element(2, lists:max([{H, P} || P <- erlang:processes(),"
    " {total_heap_size, H} <- [erlang:process_info(P, total_heap_size)]]))"
)
# A classic queue's process, or a quorum queue's Ra server on this node.
_QUEUE_PROCESS = (
    'case rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"{queue}">>)) of'
    " {{ok, Q}} -> case amqqueue:get_pid(Q) of {{RaName, _}} -> whereis(RaName); P -> P end end"
)
_SINCE = (
    f"{{ok, S0}} = application:get_env(rabbit, {_KEY}), application:unset_env(rabbit, {_KEY}),"
    " Kinds = lists:foldl(fun(P, Acc) ->"
    "   case {erlang:process_info(P, reductions), erlang:process_info(P, total_heap_size)} of"
    "     {{reductions, R}, {total_heap_size, H}} ->"
    "       K = proc_lib:translate_initial_call(P), D = R - maps:get(P, S0, 0),"
    "       maps:update_with(K, fun({D0, N0, H0}) -> {D0 + D, N0 + 1, max(H0, H)} end, {D, 1, H}, Acc);"
    f"     _ -> Acc end end, #{{}}, erlang:processes() -- [self(), whereis({_TRACER})]),"
    " Top = lists:sublist(lists:reverse(lists:keysort(2, [{K, D, N, H} || {K, {D, N, H}} <- maps:to_list(Kinds)])), 8),"
    " Msacc = erlang:statistics(microstate_accounting), erlang:system_flag(microstate_accounting, false),"
    " States = lists:foldl(fun(#{type := Type, counters := C}, Acc) -> maps:fold(fun(State, V, A) ->"
    "   maps:update_with({Type, State}, fun(X) -> X + V end, V, A) end, Acc, C) end, #{},"
    "   case Msacc of undefined -> []; _ -> Msacc end),"
    f" Traced = case whereis({_TRACER}) of undefined -> [];"
    "   T -> T ! {report, self()}, receive {gc_trace, Mi, Ma, Ns} -> [{Mi, Ma, Ns}] after 5000 -> [] end end,"
    " [lists:flatten(io_lib:format('kind ~p reductions=~b processes=~b max_heap_words=~b', [K, D, N, H]))"
    "  || {K, D, N, H} <- Top]"
    " ++ [begin {G0, W0, _} = maps:get(gc, S0), {G1, W1, _} = erlang:statistics(garbage_collection),"
    " lists:flatten(io_lib:format('gc collections=~b reclaimed_words=~b', [G1 - G0, W1 - W0])) end]"
    " ++ [lists:flatten(io_lib:format('msacc ~w',"
    "   [maps:map(fun(_, V) -> erlang:convert_time_unit(V, perf_counter, microsecond) end, States)]))]"
    " ++ [lists:flatten(io_lib:format('traced minor=~b major=~b ns=~b', [Mi, Ma, Ns])) || {Mi, Ma, Ns} <- Traced]."
)
_KIND = re.compile(r"kind \{(\w+),(\w+),(\d+)\} reductions=(-?\d+) processes=(\d+) max_heap_words=(\d+)")
_GC = re.compile(r"gc collections=(\d+) reclaimed_words=(\d+)")
_TRACED_KIND = re.compile(r"traced \{(\w+),(\w+),(\d+)\}")
_TRACED = re.compile(r"traced minor=(\d+) major=(\d+) ns=(\d+)")


_COUNTER = re.compile(r"\{(\w+),(\w+)\}\s*=>\s*(\d+)")


def busy_seconds(msacc_output: str) -> dict[str, float]:
    """``{"<thread type> <activity>": seconds}`` from the printed msacc map, sleep left out,
    the busiest first; entries under 10 ms are dropped."""
    busy: dict[str, float] = defaultdict(float)
    for thread, activity, micros in _COUNTER.findall(msacc_output):
        if activity != "sleep":
            busy[f"{thread} {activity}"] += int(micros) / 1e6
    return {k: round(v, 2) for k, v in sorted(busy.items(), key=lambda kv: -kv[1]) if v >= 0.01}


def mark(rabbit: infra.RabbitNode, queue: tuple[str, str] | None = None) -> str:
    """Start measuring; returns the kind of process whose collections are traced: ``queue``'s
    (vhost, name), or the one with the largest heap now."""
    traced = _LARGEST_HEAP if queue is None else _QUEUE_PROCESS.format(vhost=queue[0], queue=queue[1])
    printed = rabbit.ctl("eval", _MARK.replace("{traced}", traced), timeout=60)
    found = _TRACED_KIND.search(printed)
    return f"{found[1]}:{found[2]}/{found[3]}" if found else "?"


def since(rabbit: infra.RabbitNode, traced: str = "?") -> list[dict[str, object]]:
    """The eight kinds of process that did the most reductions since ``mark``, the node's
    garbage collections, the seconds per thread state, and the traced process's collections."""
    return parse(rabbit.ctl("eval", _SINCE, timeout=60), traced)


def parse(printed: str, traced: str = "?") -> list[dict[str, object]]:
    """The rows ``since`` returns, from what its eval printed."""
    rows: list[dict[str, object]] = [
        {
            "process": f"{m}:{f}/{a}",
            "reductions": int(r),
            "processes": int(n),
            "max_heap_mib": round(int(h) * 8 / 2**20, 1),
        }
        for m, f, a, r, n, h in _KIND.findall(printed)
    ]
    rows += [
        {"process": "garbage collection (all)", "collections": int(g), "reclaimed_mib": round(int(w) * 8 / 2**20, 1)}
        for g, w in _GC.findall(printed)
    ]
    busy = busy_seconds(printed)
    if busy:
        rows.append({"process": "thread states (s)", **busy})
    rows += [
        {"process": f"collections of {traced}", "minor": int(mi), "major": int(ma), "seconds": round(int(ns) / 1e9, 3)}
        for mi, ma, ns in _TRACED.findall(printed)
    ]
    return rows
