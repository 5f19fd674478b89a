#!/usr/bin/env python3
"""Makes the README's benchmark tables from `baton bench SUITE --json` outputs.

Run every suite once per run, saving DIRECTORY/SUITE-N.json (N = 1, 2, 3...), for example:

    for i in 1 2 3; do for s in signals roles lifecycle defaults database channels inbox; do
      .build/release/baton bench $s --json > DIRECTORY/$s-$i.json; done; done

then:

    python3 scripts/bench-tables.py DIRECTORY one 2   # one run, value / floor = ratio per condition
    python3 scripts/bench-tables.py DIRECTORY ranges  # every run: ranges of values and ratios
    python3 scripts/bench-tables.py DIRECTORY count   # how many runs meet each target

Each row names a figure and the floor it is divided by (both from the same run); `{best}` stands
for the faster of POSIX mq and the Unix socket, whichever the run's JSON names as the floor.
"""
import glob
import json
import os
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
directory = sys.argv[1]
runs = sorted({int(os.path.basename(p).rsplit('-', 1)[1].split('.')[0]) for p in glob.glob(directory + '/signals-*.json')})


def load(s, i):
    return json.load(open('%s/%s-%d.json' % (directory, s, i)))['results']


# (suite, name, floor_name, label, floor label, target)
ROWS=[
('signals','post_to_wake_p50_us','futex_pingpong_p50_us','post to woken observer, p50','futex ping-pong','≤ 2 idle, ≤ 3 loaded'),
('signals','post_to_wake_p99_us','futex_pingpong_p99_us','post to woken observer, p99','futex ping-pong','≤ 2 idle, ≤ 3 loaded'),
('signals','fanout16_last_wake_p50_us','futex_wake16_last_p50_us','last of 16 watching processes woken, p50','raw futex wake of 16 processes','≤ 2'),
('signals','fanout16_last_wake_p99_us','futex_wake16_last_p99_us','last of 16 watching processes woken, p99','raw futex wake of 16 processes','≤ 2'),
('signals','fanout16_cpu_per_wake_us','futex_wake16_cpu_per_wake_us','processor time of each of the 16 processes per wake-up, median','raw futex waiter','diagnostic'),
('roles','preemption_p50_us','flock_handoff_plus_signal_p50_us','preemption to the grant, p50 (role code on `signals.executor`)','flock hand-off + signal','≤ 3'),
('roles','preemption_p99_us','flock_handoff_plus_signal_p99_us','preemption to the grant, p99','flock hand-off + signal','≤ 3'),
('roles','preemption_default_executor_p50_us','flock_handoff_plus_signal_p50_us','preemption to the grant, p50, global executor','flock hand-off + signal','—'),
('roles','crash_takeover_p50_us','raw_flock_crash_notice_p50_us','crash takeover, p50','raw flock waiter notices SIGKILL','≤ 1.5'),
('roles','uncontended_acquire_release_p50_us','raw_open_flock_close_p50_us','uncontended acquire + release, p50','open + flock + close','—'),
('lifecycle','preemption_to_connected_p50_us','raw_flock_handover_connect_p50_us','role preemption to the new connection up, p50','raw flock hand-over + connect','≤ 3'),
('lifecycle','preemption_to_connected_p99_us','raw_flock_handover_connect_p99_us','role preemption to the new connection up, p99','raw flock hand-over + connect','≤ 3'),
('lifecycle','preemption_to_connected_state_seen_p50_us','raw_flock_handover_connect_p50_us','the same, until a `states()` subscriber sees it, p50','raw flock hand-over + connect','—'),
('lifecycle','preemption_to_connected_signal_thread_p50_us','raw_flock_handover_connect_p50_us','the same, both supervisors on `signals.executor`, p50','raw flock hand-over + connect','—'),
('lifecycle','preemption_to_connected_one_processor_p50_us','raw_flock_handover_connect_one_processor_p50_us','role preemption to the new connection up, every process on one processor, p50','raw flock hand-over + connect, on one processor','diagnostic'),
('lifecycle','preemption_to_connected_one_processor_p99_us','raw_flock_handover_connect_one_processor_p99_us','role preemption to the new connection up, every process on one processor, p99','raw flock hand-over + connect, on one processor','diagnostic'),
('lifecycle','drop_to_connected_p50_us','raw_drop_to_reconnect_p50_us','server drop to reconnected, p50','raw client reconnecting on EOF','—'),
('defaults','set_per_s','mmap_append_crc_per_s','sets/s','mmap append + CRC-32C (MMKV multi-process: 0.77 M)','≥ 1 M/s'),
('defaults','get_per_s','dictionary_get_per_s','gets/s','`Dictionary` lookup (MMKV: 1.9 M)','≥ 4 M/s'),
('defaults','set_two_processes_per_s','mmap_append_crc_two_processes_per_s','sets/s, two processes at once','both appending raw (MMKV: 0.35 M)','—'),
('defaults','set_to_watcher_p50_us','futex_wake_p50_us','set to watcher in another process, p50','raw futex wake','≤ 3'),
('defaults','set_to_watcher_p99_us','futex_wake_p99_us','set to watcher in another process, p99','raw futex wake','≤ 3'),
('database','commits_per_s_1_writer','raw_sqlite_1_writer','commits/s, 1 writer','SQLite C API','≥ 0.8'),
('database','commits_per_s_1_writer_vs_grdb','plain_grdb_pool_1_writer','commits/s, 1 writer','plain GRDB `DatabasePool`','—'),
('database','commits_per_s_4_writers','baton_1_writer','commits/s, 4 writer processes','Baton, 1 writer','≥ 1'),
('database','longest_wait_4_writers_ms','raw_sqlite_4_writers_longest_wait_ms','longest wait of any writer, 4 writers','SQLite busy handler','< 100 ms'),
('database','commit_to_observer_p50_ms','raw_commit_futex_wake_read_p50_ms','commit to `observe(_:)` in another process, p50','commit + futex wake + read','≤ 3'),
('database','commit_to_observer_p99_ms','raw_commit_futex_wake_read_p99_ms','commit to `observe(_:)` in another process, p99','commit + futex wake + read','≤ 3'),
('database','commit_to_value_observation_p50_ms','raw_commit_futex_wake_read_p50_ms','commit to a GRDB `ValueObservation` in another process, p50','commit + futex wake + read','—'),
('channels','buffered_round_trip_p50_us','{best}_round_trip_p50_us','buffered round trip (depth 10), p50','faster of POSIX mq and Unix socket','≤ 1.5'),
('channels','buffered_round_trip_p99_us','{best}_round_trip_p99_us','buffered round trip (depth 10), p99','faster of POSIX mq and Unix socket','≤ 1.5'),
('channels','rendezvous_round_trip_p50_us','{best}_round_trip_p50_us','rendezvous round trip, p50','faster of POSIX mq and Unix socket','≤ 1.5'),
('channels','rendezvous_round_trip_p99_us','{best}_round_trip_p99_us','rendezvous round trip, p99','faster of POSIX mq and Unix socket','≤ 1.5'),
('channels','rendezvous_round_trip_vs_os_handoff_p50_us','{best}_handoff_round_trip_p50_us','rendezvous round trip, p50','OS hand-off round trip (element, ack, element, ack)','like-for-like'),
('channels','rendezvous_round_trip_vs_os_handoff_p99_us','{best}_handoff_round_trip_p99_us','rendezvous round trip, p99','OS hand-off round trip (element, ack, element, ack)','like-for-like'),
('channels','buffered_round_trip_one_processor_p50_us','{best}_round_trip_one_processor_p50_us','buffered round trip, both processes on one processor, p50','faster of POSIX mq and Unix socket, on one processor','diagnostic'),
('channels','buffered_round_trip_one_processor_p99_us','{best}_round_trip_one_processor_p99_us','buffered round trip, both processes on one processor, p99','faster of POSIX mq and Unix socket, on one processor','diagnostic'),
('channels','rendezvous_round_trip_one_processor_p50_us','{best}_round_trip_one_processor_p50_us','rendezvous round trip, both processes on one processor, p50','faster of POSIX mq and Unix socket, on one processor','diagnostic'),
('channels','rendezvous_round_trip_one_processor_p99_us','{best}_round_trip_one_processor_p99_us','rendezvous round trip, both processes on one processor, p99','faster of POSIX mq and Unix socket, on one processor','diagnostic'),
('channels','throughput_unbounded_per_s','pipe_stream_per_s','throughput, unbounded','pipe stream','≥ 0.5'),
('channels','throughput_rendezvous_vs_os_handoff_per_s','{best}_handoff_per_s','throughput, rendezvous','OS hand-off (send, wait for ack)','≥ 0.5'),
('inbox','extension_start_to_stored_message_p50_ms','grdb_process_start_read_row_p50_ms','extension start to its stored message, p50','process start + GRDB read','—'),
('inbox','burst50_total_ms','naive_burst50_total_ms','burst of 50 pushes, total','every extension runs its own core','—'),
('inbox','extension_peak_rss_vs_ios_limit_mib','ios_nse_limit_mib','lean extension peak RSS','iOS extension memory limit','< 24 MiB'),
]
def fmt(v,unit):
    if unit=='us':
        if v>=1000: return '{:,.0f} µs'.format(v)
        if v>=100: return '%.0f µs'%v
        if v>=10: return '%.1f µs'%v
        return '%.2f µs'%v
    if unit=='ms':
        return '%.3f ms'%v if v<1 else ('%.1f ms'%v if v<100 else '%.0f ms'%v)
    if unit.endswith('/s'):
        if v>=1e6: return '%.2f M/s'%(v/1e6)
        if v>=1e3: return '%.1f k/s'%(v/1e3)
        return '%.0f /s'%v
    if unit=='MiB': return '%.1f MiB'%v
    return '%.3g %s'%(v,unit)
def find(res,cond,name,floor):
    floors=[floor.replace('{best}',b) for b in ('posix_mq','unix_socket')] if '{best}' in floor else [floor]
    for r in res:
        if r['condition']==cond and r['name']==name and r.get('floor_name') in floors: return r
    return None
mode=sys.argv[2]
if mode=='one':
    i=int(sys.argv[3])
    print('| suite | figure | floor (same run) | idle: value / floor = ratio | loaded: value / floor = ratio | target |')
    print('|---|---|---|---|---|---|')
    for s,n,f,label,fl,t in ROWS:
        res=load(s,i); cells=[]
        for c in ('idle','loaded'):
            r=find(res,c,n,f)
            cells.append('%s / %s = %.2f'%(fmt(r['value'],r['unit']),fmt(r['floor'],r['unit']),r['ratio']) if r else 'n/a')
        print('| %s | %s | %s | %s | %s | %s |'%(s,label,fl,cells[0],cells[1],t))
elif mode == "ranges":
    print('| suite | figure | idle: value; ratio | loaded: value; ratio | target |')
    print('|---|---|---|---|---|')
    for s,n,f,label,fl,t in ROWS:
        if t in ('—',): continue
        cells=[]
        for c in ('idle','loaded'):
            rs=[find(load(s,i),c,n,f) for i in runs]
            rs=[r for r in rs if r]
            if not rs: cells.append('n/a'); continue
            vs=sorted(r['value'] for r in rs); qs=sorted(r['ratio'] for r in rs); u=rs[0]['unit']
            cells.append('%s – %s; %.2f – %.2f'%(fmt(vs[0],u),fmt(vs[-1],u),qs[0],qs[-1]))
        print('| %s | %s (vs %s) | %s | %s | %s |'%(s,label,fl,cells[0],cells[1],t))

elif mode == "count":
    import re
    for s,n,f,label,fl,t in ROWS:
        if t in ('—', 'diagnostic'): continue
        out=[]
        for c in ('idle','loaded'):
            rs=[find(load(s,i),c,n,f) for i in runs]
            if t.startswith('≤ 2 idle'): th=2 if c=='idle' else 3; ok=[r['ratio']<=th for r in rs]
            elif t.startswith('≤'): th=float(t.split()[1]); ok=[r['ratio']<=th for r in rs]
            elif t=='like-for-like': ok=[r['ratio']<=1.5 for r in rs]
            elif t.startswith('≥') and 'M/s' in t: th=float(t.split()[1])*1e6; ok=[r['value']>=th for r in rs]
            elif t.startswith('≥'): th=float(t.split()[1]); ok=[r['ratio']>=th for r in rs]
            elif t.startswith('<') and 'ms' in t: ok=[r['value']<100 for r in rs]
            elif t.startswith('<') and 'MiB' in t: ok=[r['value']<24 for r in rs]
            else: ok=[None]
            out.append('%s %d/%d %s'%(c,sum(1 for o in ok if o),len(rs),','.join('%.2f'%r['ratio'] for r in rs)))
        print('%-10s %-60s %s'%(s,label[:60],' | '.join(out)))
else:
    sys.exit(__doc__)
