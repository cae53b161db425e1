-- History (1.2): dq_retain, dq_history, dq_history_stats, dq_history_bins (dq_history_minutes: 1.3). A record of each
-- message that leaves a queue with retention on, with its outcome, kept for
-- the queue's period; tallies behind the stats.
BEGIN;
SELECT plan(111);
-- counts the calls of functions not inlined (the outcome's, below); on before
-- anything runs, since a plpgsql expression is compiled once a transaction
SET LOCAL track_functions = 'all';
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- off by default: nothing is recorded
SELECT dq_offer('t_hist', 'before', '0');
SELECT dq_ack((SELECT lock_token FROM dq_poll('t_hist')));
SELECT is((SELECT count(*)::int FROM dq_history), 0, 'a queue without retention records nothing');
SELECT is((SELECT count(*)::int FROM dq_history_deltas), 0, 'nor tallies anything');
SELECT is((SELECT count(*)::int FROM dq_history('t_hist')), 0, 'dq_history of such a queue is empty');

SELECT lives_ok($$SELECT dq_retain('t_hist', '1 day')$$, 'dq_retain turns it on');

-- acked, with what the message had
SELECT dq_offer('t_hist', 'a', '{"n": 1}', '2024-01-01 09:59:00+00', TRUE, 'ch', 3, '{"h": 1}');
SELECT set_config('dq.now', '2024-01-01 10:00:02+00', TRUE);
CREATE TEMP TABLE got AS SELECT * FROM dq_poll('t_hist', '1 minute');
SELECT dq_nack((SELECT lock_token FROM got), '2024-01-01 10:00:05+00', '{"s": 1}', 'boom');
SELECT set_config('dq.now', '2024-01-01 10:00:10+00', TRUE);
TRUNCATE got;
INSERT INTO got SELECT * FROM dq_poll('t_hist', '1 minute');
SELECT set_config('dq.now', '2024-01-01 10:00:12.5+00', TRUE);
SELECT dq_ack((SELECT lock_token FROM got), 't_hist');
SELECT results_eq(
    $$SELECT queue, key, outcome, payload, state, channel, priority, created_at, scheduled_at, last_leased_at,
        finished_at, attempts, last_error, headers
      FROM dq_history('t_hist')$$,
    $$VALUES ('t_hist'::text, 'a'::text, 'acked'::text, '{"n": 1}'::jsonb, '{"s": 1}'::jsonb, 'ch'::text, 3,
        '2024-01-01 10:00:00+00'::timestamptz, '2024-01-01 09:59:00+00'::timestamptz,
        '2024-01-01 10:00:10+00'::timestamptz, '2024-01-01 10:00:12.5+00'::timestamptz, 2, 'boom'::text,
        '{"h": 1}'::jsonb)$$,
    'an acked message: its record holds what it had when it left'
);
SELECT is((SELECT id FROM dq_history('t_hist')), (SELECT id FROM got), 'and its id');

-- every ack call, every outcome
SELECT dq_offer_many('t_hist', ARRAY['b', 'c', 'd'], ARRAY['1', '2', '3']::jsonb[]);
SELECT is(dq_ack_many(array(SELECT lock_token FROM dq_poll_many('t_hist', 1))), 1, 'dq_ack_many');
-- the trigger reads the outcome inlined, not by a call of a SQL function
-- (1.3: a call cost 45 us); track_functions counts the calls not inlined
SELECT dq_retain('t_inlined', '1 day');
SELECT dq_offer('t_inlined', 'a', '1');
SELECT is(dq_ack_many(array(SELECT lock_token FROM dq_poll_many('t_inlined', 1))), 1, 'an ack recorded');
SELECT is(
    (
        SELECT count(*)::int FROM pg_stat_xact_user_functions
        WHERE funcname = 'dq__deleting_outcome'
    ), 0,
    'reads its outcome without a call (1.3)'
);
SELECT dq_retain('t_inlined', NULL);
DELETE FROM dq_history
WHERE queue = 't_inlined';
SELECT is((SELECT count(*)::int FROM dq_ack_poll(array(SELECT lock_token FROM dq_poll_many('t_hist', 1)), 't_hist', 0)), 0, 'dq_ack_poll');
SELECT dq_dead_letter((SELECT lock_token FROM dq_poll('t_hist')), 'given up');
SELECT results_eq(
    $$SELECT key, outcome, last_error FROM dq_history('t_hist') WHERE key IN ('b', 'c', 'd') ORDER BY key$$,
    $$VALUES ('b'::text, 'acked'::text, NULL::text), ('c', 'acked', NULL), ('d', 'dead', 'given up')$$,
    'acked by dq_ack_many and dq_ack_poll, dead by dq_dead_letter with its error as the last error (1.3)'
);
-- 1.3: a batch ack naming a queue without retention counts its own deletes
-- while another queue keeps history: the trigger that records (and counts)
-- does not run for it
SELECT dq_send_many('t_plain', array_fill('{}'::jsonb, ARRAY[3]));
SET LOCAL track_functions = 'pl';
-- how many times this transaction ran the count trigger's function
CREATE FUNCTION pg_temp.trigger_runs() RETURNS int LANGUAGE sql AS $$
    SELECT coalesce(sum(f.calls), 0)::int
    FROM pg_stat_xact_user_functions AS f
    WHERE f.funcname = 'dq__count_rows'
$$;
CREATE TEMP TABLE trigger_calls AS SELECT pg_temp.trigger_runs() AS calls;
SELECT is(dq_ack_many(array(SELECT lock_token FROM dq_poll_many('t_plain', 2)), 't_plain'), 2, 'dq_ack_many of t_plain');
SELECT is(
    pg_temp.trigger_runs() - (SELECT t.calls FROM trigger_calls AS t),
    0, 'an ack naming a queue without retention counts itself while t_hist keeps history (1.3)'
);
-- without a queue, an ack leaves its rows to the trigger while a queue keeps
-- history: it records none of t_plain's
UPDATE trigger_calls SET calls = pg_temp.trigger_runs();
SELECT is(
    (SELECT count(*)::int FROM dq_ack_poll(array(SELECT lock_token FROM dq_poll_many('t_plain', 1)), 't_plain', 0)), 0,
    'dq_ack_poll of t_plain'
);
SELECT is(
    pg_temp.trigger_runs() - (SELECT t.calls FROM trigger_calls AS t),
    1, 'an ack without a queue goes through the trigger while a queue keeps history'
);
SELECT is((SELECT count(*)::int FROM dq_history('t_plain')), 0, 'which records nothing of t_plain');
-- a batch of two queues, one keeping history: the trigger runs once, for the whole statement,
-- recording t_hist2's message and not t_plain's, and counting both
SELECT dq_retain('t_hist2', '1 day');
SELECT dq_send('t_plain', '{}');
SELECT dq_offer('t_hist2', 'mixed', '{}');
CREATE TEMP TABLE mixed AS
SELECT p.lock_token FROM dq_poll_many('t_plain', 1) AS p
UNION ALL
SELECT h.lock_token FROM dq_poll_many('t_hist2', 1) AS h;
UPDATE trigger_calls SET calls = pg_temp.trigger_runs();
SELECT is(dq_ack_many(array(SELECT m.lock_token FROM mixed AS m)), 2, 'dq_ack_many of t_plain and t_hist');
SELECT is(
    pg_temp.trigger_runs() - (SELECT t.calls FROM trigger_calls AS t),
    1, 'a batch with a message of a queue keeping history goes through the trigger'
);
SELECT results_eq(
    $$SELECT queue, key, outcome FROM dq_history('t_hist2') WHERE key = 'mixed'
      UNION ALL SELECT queue, key, outcome FROM dq_history('t_plain')$$,
    $$VALUES ('t_hist2'::text, 'mixed'::text, 'acked'::text)$$,
    'which records the message of t_hist2, not that of t_plain'
);
SELECT ok(
    array(
        SELECT row(c.*)::text FROM dq__counted_stats(dq_now()) AS c
        ORDER BY c.queue
    ) = array(
        SELECT row(s.*)::text FROM dq__scanned_stats(dq_now()) AS s
        ORDER BY s.queue
    ),
    'and the counts agree with the messages, counted by the function or by the trigger'
);
RESET track_functions;
-- a caller under row-level security on dq_queues, which could hide a
-- queue's retention, leaves its acks to the trigger, which records (1.3)
SELECT dq_offer('t_hist2', 'hidden', '{}');
CREATE TEMP TABLE hidden AS SELECT h.lock_token FROM dq_poll_many('t_hist2', 1) AS h;
CREATE ROLE t_hist_acker;
GRANT SELECT, UPDATE, DELETE ON dq_messages TO t_hist_acker;
GRANT SELECT ON dq_queues, hidden TO t_hist_acker;
GRANT INSERT ON dq_counts TO t_hist_acker;
ALTER TABLE dq_queues ENABLE ROW LEVEL SECURITY;
CREATE POLICY t_hist_hidden ON dq_queues TO t_hist_acker USING (queue <> 't_hist2');
SET LOCAL ROLE t_hist_acker;
SELECT is(
    dq_ack_many(array(SELECT h.lock_token FROM hidden AS h)), 1,
    'a role that cannot see t_hist2''s settings acks its message'
);
RESET ROLE;
SELECT is(
    (SELECT count(*)::int FROM dq_history('t_hist2', 'hidden')), 1,
    'and the trigger records it'
);
ALTER TABLE dq_queues DISABLE ROW LEVEL SECURITY;
-- the tests below read every queue's records: t_hist2's go
DELETE FROM dq_history
WHERE queue = 't_hist2';
DELETE FROM dq_history_deltas
WHERE queue = 't_hist2';
SELECT dq_offer('t_hist', 'e', '5');
SELECT dq_cancel('t_hist', 'e');
SELECT dq_cancel_id('t_hist', dq_send('t_hist', '6'));
SELECT dq_offer('t_hist', 'f', '7');
SELECT dq_purge('t_hist');
SELECT results_eq(
    $$SELECT key, outcome, last_leased_at FROM dq_history('t_hist') WHERE outcome IN ('cancelled', 'purged') ORDER BY id$$,
    $$VALUES ('e'::text, 'cancelled'::text, NULL::timestamptz), (NULL, 'cancelled', NULL), ('f', 'purged', NULL)$$,
    'cancelled by dq_cancel and dq_cancel_id (key NULL: keyless), purged by dq_purge; never delivered'
);
-- buried by a poll
SELECT dq_configure('t_hist', 1);
SELECT dq_offer('t_hist', 'g', '8');
SELECT dq_nack((SELECT lock_token FROM dq_poll('t_hist')), NULL, NULL, 'bad');
SELECT is((SELECT count(*)::int FROM dq_poll('t_hist')), 0, 'a poll buries a message out of attempts');
SELECT results_eq(
    $$SELECT outcome, attempts, last_error FROM dq_history('t_hist', 'g')$$,
    $$VALUES ('dead'::text, 1, 'bad'::text)$$,
    'recorded dead, with its attempts and last error'
);
SELECT dq_configure('t_hist', NULL);
-- redriven and acked: two records
SELECT dq_dead_redrive('t_hist', 'g');
SELECT dq_ack((SELECT lock_token FROM dq_poll('t_hist')));
SELECT results_eq(
    $$SELECT outcome FROM dq_history('t_hist', 'g')$$,
    $$VALUES ('acked'::text), ('dead')$$,
    'a message redriven and acked has two records, newest first'
);
-- no record for deletes with no outcome
SELECT dq_cron_install('t_hist', 'cron:', 'h1', ARRAY['2024-01-02 00:00+00']::timestamptz[], ARRAY['{}']::jsonb[]);
SELECT dq_cron_uninstall('t_hist', 'cron:');
SELECT dq_schedule_set('t_hist', 'tick', '* * * * *');
SELECT dq_poll_many('t_hist', 0);
SELECT set_config('dq.now', '2024-01-01 10:01:10+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_hist', 0)), 0, 'materialised a tick');
SELECT dq_schedule_remove('t_hist', 'tick');
SELECT dq_offer('t_hist', 'h', '9');
SELECT dq_nack((SELECT lock_token FROM dq_poll('t_hist')), '2024-01-01 10:01:10+00', NULL, 'nacked once');
SELECT dq_dead_letter((SELECT lock_token FROM dq_poll('t_hist')));
SELECT is(
    (SELECT last_error FROM dq_history('t_hist', 'h')), NULL,
    'dq_dead_letter without an error: no last error, as its dead letter has none'
);
SELECT dq_dead_purge('t_hist', 'h');
SELECT is(
    (
        SELECT count(*)::int FROM dq_history('t_hist')
        WHERE key LIKE 'cron:%' OR key LIKE 'tick%'
    ), 0,
    'cron uninstalls and schedule removals leave no record'
);
SELECT is((SELECT count(*)::int FROM dq_history('t_hist', 'h')), 1, 'a dead letter purged leaves only its dead record');
DELETE FROM dq_messages
WHERE queue = 't_hist';
SELECT is((SELECT count(*)::int FROM dq_history('t_hist', 'i')), 0, 'nor does a plain DELETE');

-- reading
SELECT is((SELECT count(*)::int FROM dq_history('t_hist')), 10, 'every record');
SELECT is((SELECT count(*)::int FROM dq_history('t_hist', NULL, 3)), 3, 'at most max_count');
SELECT is((SELECT count(*)::int FROM dq_history('t_hist', NULL, 0)), 0, 'max_count 0: nothing');
SELECT is((SELECT count(*)::int FROM dq_history('t_hist', NULL, -1)), 0, 'max_count below 0: nothing');
SELECT ok(
    (
        SELECT bool_and(h.ord = s.ord)
        FROM (SELECT
            row_number() OVER () AS ord,
            finished_at,
            id
        FROM dq_history('t_hist')) AS h
        INNER JOIN (
            SELECT
                row_number() OVER (ORDER BY finished_at DESC, id DESC) AS ord,
                finished_at,
                id
            FROM dq_history
        ) AS s ON h.id = s.id AND h.finished_at = s.finished_at
    ),
    'newest finish first, ties by id descending'
);
SELECT is((SELECT count(*)::int FROM dq_history('t_other')), 0, 'another queue''s records are its own');
SELECT throws_ok($$SELECT * FROM dq_history(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'dq_history: NULL queue');
SELECT throws_ok(
    $$SELECT * FROM dq_history('t_hist', NULL, NULL)$$, '22004', 'pgdq: max_count must not be NULL',
    'dq_history: NULL max_count'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history('t_hist', '')$$, '22023', NULL, 'dq_history: a key that is no key'
);

-- stats: per bucket of finish, aligned to the epoch
SELECT results_eq(
    $$SELECT bucket_at, acked, dead, cancelled FROM dq_history_stats('t_hist', '2024-01-01 09:00+00', '1 minute')$$,
    $$VALUES ('2024-01-01 10:00+00'::timestamptz, 4::bigint, 2::bigint, 2::bigint),
             ('2024-01-01 10:01+00', 0, 1, 0)$$,
    'dq_history_stats counts outcomes per bucket, only buckets with records'
);
SELECT results_eq(
    $$SELECT bucket_at, acked FROM dq_history_stats('t_hist', '2024-01-01 10:00:12.9+00', '1 second')$$,
    $$VALUES ('2024-01-01 10:00:12+00'::timestamptz, 4::bigint), ('2024-01-01 10:01:10+00', 0)$$,
    'from the bucket holding since'
);
SELECT results_eq(
    $$SELECT lateness_p50, run_p50 FROM dq_history_stats('t_hist', '2024-01-01 10:00:12+00', '1 second') LIMIT 1$$,
    $$VALUES (interval '0.0005 seconds', interval '0.0005 seconds')$$,
    'lateness and run time under a millisecond'
);
CREATE TEMP TABLE before_fold AS SELECT * FROM dq_history_stats('t_hist', '2024-01-01 09:00+00', '1 minute');
SELECT dq__fold_history();
SELECT is((SELECT count(*)::int FROM dq_history_deltas), 0, 'a fold takes every delta');
SELECT results_eq(
    $$SELECT * FROM dq_history_stats('t_hist', '2024-01-01 09:00+00', '1 minute')$$,
    $$SELECT * FROM before_fold$$,
    'and the stats are the same'
);
SELECT results_eq(
    $$SELECT bucket_at, acked, dead, cancelled FROM dq_history_stats('t_hist', '2024-01-01 09:00+00', '7 seconds')$$,
    $$SELECT date_bin('7 seconds', finished_at, 'epoch'), count(*) FILTER (WHERE outcome = 'acked'),
        count(*) FILTER (WHERE outcome = 'dead'), count(*) FILTER (WHERE outcome = 'cancelled')
      FROM dq_history GROUP BY 1 ORDER BY 1$$,
    'a bucket of whole seconds that are not whole minutes counts what the records say'
);

-- percentiles within 5 % (or 1 ms) of the exact ones
SELECT dq_retain('t_pct', '1 day');
SELECT set_config('dq.now', '2024-01-01 11:00:00+00', TRUE);
SELECT dq_send_many('t_pct', array_fill('{}'::jsonb, ARRAY[200]));
CREATE TEMP TABLE pct_leases AS SELECT lock_token FROM dq_poll_many('t_pct', 200, '1 hour');
DO $$
DECLARE
    v_token uuid;
    i integer := 0;
BEGIN
    FOR v_token IN SELECT lock_token FROM pct_leases LOOP
        i := i + 1;
        -- run times from 10 ms to 4 s, spread unevenly
        PERFORM set_config('dq.now', (timestamptz '2024-01-01 11:00:00+00' + make_interval(secs => 0.01 * i * i / 10))::text, TRUE);
        PERFORM dq_ack(v_token);
    END LOOP;
END
$$;
SELECT set_config('dq.now', '2024-01-01 11:10:00+00', TRUE);
CREATE TEMP TABLE exact AS
SELECT
    percentile_cont(0.5) WITHIN GROUP (ORDER BY finished_at - last_leased_at) AS p50,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY finished_at - last_leased_at) AS p99
FROM dq_history
WHERE queue = 't_pct';
SELECT ok(
    (
        SELECT
            abs(extract(EPOCH FROM s.run_p50 - e.p50)) <= greatest(0.05 * extract(EPOCH FROM e.p50), 0.001)
            AND abs(extract(EPOCH FROM s.run_p99 - e.p99)) <= greatest(0.05 * extract(EPOCH FROM e.p99), 0.001)
        FROM dq_history_stats('t_pct', '2024-01-01 11:00+00', '1 hour') AS s, exact AS e
    ),
    'run-time percentiles within 5 % of the exact ones (percentile_cont)'
);
SELECT is(
    (
        SELECT s.run_p50 FROM dq_history_stats('t_pct', '2024-01-01 11:00:00.1+00', '1 second') AS s
        WHERE s.bucket_at = '2024-01-01 11:00:00.1+00'
    ),
    NULL, 'a bucket that no record finished in has no row'
);
SELECT is(
    (SELECT acked FROM dq_history_stats('t_pct', '2024-01-01 11:00+00', '1 hour')), 200::bigint, 'all 200 counted'
);

-- 1.3: the percentiles of every bucket in one pass, not a function call per
-- bucket (10,000 one-minute buckets of a busy week took 10 s, and a dozen such
-- requests at once made the HTTP service answer 503): 3,000 buckets with
-- lateness and run times cost a handful of calls of pgdq's functions
SELECT dq_retain('t_many', '30 days');
INSERT INTO dq_history_tallies (queue, width, at, measure, bin, n)
SELECT
    't_many' AS queue,
    1 AS width,
    timestamptz '2024-01-01 11:10:00+00' - make_interval(secs => s.s) AS at,
    m.measure,
    m.bin,
    2 AS n
FROM generate_series(1, 3000) AS s (s)
CROSS JOIN (VALUES ('a', 0), ('l', 40), ('r', 50), ('r', 60)) AS m (measure, bin);
SET LOCAL track_functions = 'all';
CREATE TEMP TABLE calls_before AS
SELECT
    funcid,
    calls
FROM pg_stat_xact_user_functions;
SELECT is(
    (
        SELECT count(*)::int FROM dq_history_stats('t_many', '2024-01-01 10:00+00', '1 second')
        WHERE run_p99 IS NOT NULL
    ),
    3000, 'dq_history_stats: 3,000 buckets, each with its percentiles'
);
SELECT cmp_ok(
    (
        SELECT sum(a.calls - coalesce(b.calls, 0))::int
        FROM pg_stat_xact_user_functions AS a
        LEFT JOIN calls_before AS b ON a.funcid = b.funcid
    ),
    '<', 30, 'in one pass: a few calls of pgdq''s functions, not some per bucket'
);
RESET track_functions;

-- dq_history_bins: the histograms behind the stats, per minute
SELECT dq_retain('t_bins', '1 day');
SELECT set_config('dq.now', '2024-01-01 12:00:00+00', TRUE);
SELECT dq_send_many('t_bins', array_fill('{}'::jsonb, ARRAY[3]));
CREATE TEMP TABLE bins_leases AS SELECT lock_token FROM dq_poll_many('t_bins', 3, '1 hour');
SELECT set_config('dq.now', '2024-01-01 12:00:01+00', TRUE);
SELECT dq_ack((SELECT min(lock_token::text)::uuid FROM bins_leases));
SELECT set_config('dq.now', '2024-01-01 12:00:03.5+00', TRUE);
SELECT dq_ack((SELECT max(lock_token::text)::uuid FROM bins_leases));
SELECT dq__fold_history();  -- these two from the tallies, the rest from the deltas
SELECT set_config('dq.now', '2024-01-01 12:01:10+00', TRUE);
SELECT dq_ack_many((SELECT array_agg(lock_token) FROM bins_leases));  -- the third
SELECT dq_send('t_bins', '{}');
TRUNCATE bins_leases;
INSERT INTO bins_leases SELECT lock_token FROM dq_poll('t_bins', '1 hour');
SELECT set_config('dq.now', '2024-01-01 12:01:10.2+00', TRUE);
SELECT dq_ack((SELECT lock_token FROM bins_leases));
SELECT set_config('dq.now', '2024-01-01 12:02:00+00', TRUE);
SELECT results_eq(
    $$SELECT minute_at, (sum(n) FILTER (WHERE measure = 'lateness'))::bigint, (sum(n) FILTER (WHERE measure = 'run'))::bigint
      FROM dq_history_bins('t_bins', '2024-01-01 11:00+00') GROUP BY 1 ORDER BY 1$$,
    $$SELECT bucket_at, acked + dead, acked + dead FROM dq_history_stats('t_bins', '2024-01-01 11:00+00', '1 minute')$$,
    'dq_history_bins: per minute, each measure sums to the messages dq_history_stats counts'
);
SELECT results_eq(
    $$SELECT minute_at, bin, n FROM dq_history_bins('t_bins', '2024-01-01 11:00+00') WHERE measure = 'run'$$,
    $$SELECT date_bin('1 minute', finished_at, 'epoch'), dq__duration_bin(finished_at - last_leased_at), count(*)
      FROM dq_history WHERE queue = 't_bins' GROUP BY 1, 2 ORDER BY 1, 2$$,
    'dq_history_bins: the run times of known acks in their bins (1 s, 3.5 s, 70 s, 0.2 s)'
);
SELECT results_eq(
    $$SELECT minute_at, bin, n FROM dq_history_bins('t_bins', '2024-01-01 11:00+00') WHERE measure = 'lateness'$$,
    $$VALUES (timestamptz '2024-01-01 12:00+00', 0::smallint, 2::bigint),
        ('2024-01-01 12:01+00', 0::smallint, 2::bigint)$$,
    'dq_history_bins: lateness, none here (delivered when due)'
);
SELECT is(
    (
        SELECT sum(n)::int FROM dq_history_bins('t_bins', '2024-01-01 12:01:59+00')
        WHERE measure = 'run'
    ), 2,
    'dq_history_bins: from the minute holding since'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_bins('t_bins', NULL)$$, '22004', 'pgdq: since must not be NULL',
    'dq_history_bins: NULL since'
);

-- dq_history_minutes (1.3): dq_history_stats by the minute and dq_history_bins
-- of every queue that keeps history (or of those given), in one statement
CREATE FUNCTION pg_temp.minutes_each(since timestamptz, queues text[] DEFAULT NULL)
RETURNS TABLE (
    queue text, minute_at timestamptz, acked bigint, dead bigint, cancelled bigint, measure text, bin smallint, n bigint
)
LANGUAGE sql AS $$
    SELECT q.queue::text, s.bucket_at, s.acked, s.dead, s.cancelled, NULL::text, NULL::smallint, NULL::bigint
    FROM dq_queues AS q CROSS JOIN LATERAL dq_history_stats(q.queue, since, '1 minute') AS s
    WHERE q.history_keep IS NOT NULL AND (queues IS NULL OR q.queue = ANY (queues))
    UNION ALL
    SELECT q.queue::text, b.minute_at, NULL, NULL, NULL, b.measure, b.bin, b.n
    FROM dq_queues AS q CROSS JOIN LATERAL dq_history_bins(q.queue, since) AS b
    WHERE q.history_keep IS NOT NULL AND (queues IS NULL OR q.queue = ANY (queues))
    ORDER BY 1, 2, 6, 7
$$;
SELECT results_eq(
    $$SELECT * FROM dq_history_minutes('2024-01-01 10:00+00')$$,
    $$SELECT * FROM pg_temp.minutes_each('2024-01-01 10:00+00')$$,
    'dq_history_minutes: the rows of dq_history_stats and dq_history_bins of every queue kept'
);
SELECT ok(
    (SELECT count(DISTINCT queue) >= 3 AND count(measure) > 0 FROM dq_history_minutes('2024-01-01 10:00+00')),
    'dq_history_minutes: of several queues, counts and bins'
);
SELECT results_eq(
    $$SELECT * FROM dq_history_minutes('2024-01-01 12:00:30+00', ARRAY['t_bins', 't_none'])$$,
    $$SELECT * FROM pg_temp.minutes_each('2024-01-01 12:00:30+00', ARRAY['t_bins'])$$,
    'dq_history_minutes: of the queues given, from the minute holding since'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_minutes(NULL)$$, '22004', 'pgdq: since must not be NULL',
    'dq_history_minutes: NULL since'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_minutes(dq_now() - interval '10000 minutes')$$, '22023',
    'pgdq: since must be at most 10000 minutes before now, got 10001 minutes',
    'dq_history_minutes: more than 10,000 minutes'
);

-- turning it off; ageing out
SELECT dq_retain('t_hist', NULL);
SELECT dq_offer('t_hist', 'late', '1');
SELECT dq_cancel('t_hist', 'late');
SELECT is((SELECT count(*)::int FROM dq_history('t_hist', 'late')), 0, 'off: no new record');
SELECT is((SELECT count(*)::int FROM dq_history('t_hist')), 10, 'records already kept stay');
SELECT set_config('dq.now', '2024-01-02 10:00:13+00', TRUE);
SELECT is(
    (SELECT count(*)::int FROM dq_history('t_hist')), 1,
    'and age out after the period the queue had: the one finished a day ago or less remains'
);
SELECT is(
    (SELECT sum(acked + dead + cancelled)::int FROM dq_history_stats('t_hist', '2024-01-01 10:01+00', '1 hour')), 1,
    'the stats count only records that have not aged out'
);
SELECT dq__expire_history(ARRAY['t_hist'], 1000);
SELECT is((
    SELECT count(*)::int FROM dq_history
    WHERE queue = 't_hist'
), 1, 'expiry deletes the records aged out');
SELECT set_config('dq.now', '2024-01-03 10:00:00+00', TRUE);
SELECT dq__expire_history(ARRAY['t_hist'], 1000);
SELECT is(
    (
        SELECT count(*)::int FROM dq_history_tallies
        WHERE queue = 't_hist'
    ), 0, 'and their tallies'
);

-- a record that aged out stays out when the period grows; one at the edge
-- of the period counts in every bucket size
SELECT dq_retain('t_edge', '10 minutes');
SELECT set_config('dq.now', '2024-02-01 10:00:00.1+00', TRUE);
SELECT dq_offer('t_edge', 'old', '1');
SELECT dq_cancel('t_edge', 'old');
SELECT set_config('dq.now', '2024-02-01 10:00:00.7+00', TRUE);
SELECT dq_offer('t_edge', 'edge', '1');
SELECT dq_cancel('t_edge', 'edge');
SELECT set_config('dq.now', '2024-02-01 10:10:00.5+00', TRUE);
SELECT results_eq(
    $$SELECT key FROM dq_history('t_edge')$$, $$VALUES ('edge'::text)$$, 'ten minutes on: the older one aged out'
);
SELECT results_eq(
    $$SELECT (SELECT sum(cancelled) FROM dq_history_stats('t_edge', '2024-02-01 09:00+00', '1 minute')),
             (SELECT sum(cancelled) FROM dq_history_stats('t_edge', '2024-02-01 09:00+00', '1 second')),
             (SELECT sum(cancelled) FROM dq_history_stats('t_edge', '2024-02-01 09:00+00', '7 seconds'))$$,
    $$VALUES (1::numeric, 1::numeric, 1::numeric)$$,
    'the one still in its period counts, in buckets of minutes or seconds'
);
SELECT dq_retain('t_edge', '1 day');
SELECT results_eq(
    $$SELECT key FROM dq_history('t_edge')$$, $$VALUES ('edge'::text)$$,
    'a longer period does not bring back a record that aged out'
);
SELECT is(
    (SELECT sum(cancelled)::int FROM dq_history_stats('t_edge', '2024-02-01 09:00+00', '1 minute')), 1,
    'nor do its stats'
);
SELECT results_eq(
    $$SELECT * FROM dq_history_minutes('2024-02-01 09:00+00')$$,
    $$SELECT * FROM pg_temp.minutes_each('2024-02-01 09:00+00')$$,
    'dq_history_minutes: as dq_history_stats at the edge of a period'
);

-- History belongs to its queue (1.3): no session setting dates a record
-- ahead of the server's clock or ages out records early, and a statement
-- expires records of its own queues only
SELECT set_config('dq.now', '', TRUE);
SELECT dq_retain('t_mine', '1 day');
SELECT dq_retain('t_theirs', '1 day');
SELECT dq_offer('t_theirs', 'kept', '1');
SELECT dq_cancel('t_theirs', 'kept');
SELECT dq_offer('t_mine', 'kept', '1');
SELECT dq_cancel('t_mine', 'kept');
SELECT set_config('dq.now', '9999-06-01 00:00+00', TRUE);
SELECT dq_offer('t_mine', 'forged', '1');
SELECT dq_cancel('t_mine', 'forged');
SELECT dq_retain('t_mine', '1 day');
SELECT dq__expire_history(ARRAY['t_mine', 't_theirs'], 1000);
SELECT set_config('dq.now', '', TRUE);
SELECT ok(
    (SELECT finished_at <= clock_timestamp() FROM dq_history('t_mine', 'forged')),
    'a session clock in 9999 dates no record ahead of the server''s'
);
SELECT results_eq(
    $$SELECT key FROM dq_history('t_mine')$$, $$VALUES ('forged'::text), ('kept')$$,
    'nor ages out the records of its queue, by expiry or by dq_retain'
);
SELECT results_eq(
    $$SELECT key FROM dq_history('t_theirs')$$, $$VALUES ('kept'::text)$$, 'nor another queue''s'
);
SELECT is(
    (SELECT sum(cancelled)::int FROM dq_history_stats('t_mine', now() - interval '1 hour', '1 minute')), 2,
    'and the tallies are there'
);
SELECT dq_offer('t_mine', 'done', '1');
SELECT dq_poll('t_mine');
SELECT is(dq_finish('t_mine', 'done'), TRUE, 'dq_finish deletes a message by key');
SELECT is(dq_finish('t_mine', 'done'), FALSE, 'false when there is none');
SELECT is(dq_finish('t_mine', 'never'), FALSE, 'false for a key never offered');
SELECT results_eq(
    $$SELECT outcome, attempts FROM dq_history('t_mine', 'done')$$, $$VALUES ('acked'::text, 1)$$,
    'and records it acked (1.3)'
);
SELECT throws_ok($$SELECT dq_finish(NULL, 'k')$$, '22004', 'pgdq: queue must not be NULL', 'dq_finish: NULL queue');
SELECT throws_ok($$SELECT dq_finish('t_mine', NULL)$$, '22004', 'pgdq: key must not be NULL', 'dq_finish: NULL key');
-- dq_finish_id (1.3): finish by id, as the classic protocol does for a keyless job
CREATE TEMP TABLE fin AS SELECT dq_send('t_mine', '8') AS id;
SELECT dq_poll('t_mine');
SELECT set_config('dq.outcome', 'purged', TRUE);
SELECT is(dq_finish_id('t_mine', (SELECT id FROM fin)), TRUE, 'dq_finish_id deletes a keyless message by id, leased');
SELECT is(current_setting('dq.outcome'), 'purged', 'and leaves the caller''s dq.outcome as it was');
SELECT set_config('dq.outcome', '', TRUE);
SELECT is(dq_finish_id('t_mine', (SELECT id FROM fin)), FALSE, 'false when there is none');
SELECT is(dq_finish_id('t_theirs', dq_send('t_mine', '9')), FALSE, 'false for another queue''s message');
SELECT results_eq(
    $$SELECT key, outcome, attempts FROM dq_history('t_mine') WHERE id = (SELECT id FROM fin)$$,
    $$VALUES (NULL::text, 'acked'::text, 1)$$,
    'and records it acked, whatever dq.outcome its caller had set'
);
SELECT set_config('dq.outcome', 'acked', TRUE);
SELECT dq_cancel_id('t_mine', max(m.id)) FROM dq_messages AS m
WHERE m.queue = 't_mine';
SELECT set_config('dq.outcome', '', TRUE);
SELECT results_eq(
    $$SELECT outcome FROM dq_history('t_mine') WHERE id = (SELECT max(h.id) FROM dq_history('t_mine') AS h)$$,
    $$VALUES ('cancelled'::text)$$,
    'dq_cancel_id records cancelled, whatever dq.outcome its caller had set'
);
SELECT throws_ok(
    $$SELECT dq_finish_id(NULL, 1)$$, '22004', 'pgdq: queue must not be NULL', 'dq_finish_id: NULL queue'
);
SELECT throws_ok(
    $$SELECT dq_finish_id('t_mine', NULL)$$, '22004', 'pgdq: id must not be NULL', 'dq_finish_id: NULL id'
);
SELECT throws_ok($$SELECT dq_finish_id('', 1)$$, '22023', NULL, 'dq_finish_id: an empty queue name');
SELECT throws_ok(
    $$SELECT dq__cancel('t_mine', 1, 'purged')$$, '22023', 'pgdq: outcome must be acked or cancelled',
    'the one place that cancels records acked or cancelled only'
);
CREATE ROLE t_fin_reader;
GRANT SELECT ON dq_messages TO t_fin_reader;
SET LOCAL ROLE t_fin_reader;
SELECT throws_ok(
    $$SELECT dq_finish_id('t_mine', 1)$$, '42501', NULL, 'dq_finish_id needs DELETE on dq_messages'
);
SELECT throws_ok($$SELECT dq_cancel_id('t_mine', 1)$$, '42501', NULL, 'as dq_cancel_id does');
RESET ROLE;
-- records of the old clock, expired only where a statement deleted
SELECT set_config('dq.now', '2024-03-01 00:00+00', TRUE);
SELECT dq_retain('t_old_a', '1 minute');
SELECT dq_retain('t_old_b', '1 minute');
SELECT dq_offer_many('t_old_a', ARRAY['x', 'y'], ARRAY['1', '2']::jsonb[]);
SELECT dq_offer_many('t_old_b', ARRAY['x', 'y'], ARRAY['1', '2']::jsonb[]);
SELECT dq_purge('t_old_a');
SELECT dq_purge('t_old_b');
SELECT set_config('dq.now', '2024-03-01 00:10+00', TRUE);
SELECT dq__expire_history(ARRAY['t_old_a'], 1);
SELECT results_eq(
    $$SELECT (SELECT count(*)::int FROM dq_history WHERE queue = 't_old_a'),
        (SELECT count(*)::int FROM dq_history WHERE queue = 't_old_b')$$,
    $$VALUES (1, 2)$$,
    'expiry takes at most max_rows records, of the queues it is given only'
);

-- errors
SELECT throws_ok($$SELECT dq_retain(NULL, '1 day')$$, '22004', 'pgdq: queue must not be NULL', 'dq_retain: NULL queue');
SELECT throws_ok(
    $$SELECT dq_retain('t_hist', '0')$$, '22023', 'pgdq: keep must be positive and at most 3650 days, or NULL, got 00:00:00',
    'dq_retain: keep 0'
);
SELECT throws_ok($$SELECT dq_retain('t_hist', '-1 hour')$$, '22023', NULL, 'dq_retain: a negative keep');
SELECT throws_ok(
    $$SELECT dq_retain('t_neg', '1 mon -29 days')$$, '22023',
    'pgdq: keep must be positive and at most 3650 days, or NULL, got 1 mon -29 days',
    'dq_retain: a keep with a negative part (1.3)'
);
SELECT throws_ok($$SELECT dq_retain('t_neg', '1 day -1 second')$$, '22023', NULL, 'dq_retain: a negative time part');
SELECT throws_ok($$SELECT dq_retain('t_neg', '-1 mon 40 days')$$, '22023', NULL, 'dq_retain: negative months');
SELECT is(
    (
        SELECT count(*)::int FROM dq_queues
        WHERE queue = 't_neg'
    ), 0, 'and nothing is written'
);
SELECT lives_ok($$SELECT dq_retain('t_neg', '1 mon 2 days 03:00')$$, 'dq_retain: a period of every part');
SELECT throws_ok($$SELECT dq_retain('t_hist', '3651 days')$$, '22023', NULL, 'dq_retain: a keep over 3650 days');
SELECT throws_ok(
    $$SELECT * FROM dq_history_stats('t_hist', now(), '0.5 seconds')$$, '22023',
    'pgdq: bucket must be from 1 second to 1 day, got 00:00:00.5', 'dq_history_stats: a bucket under a second'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_stats('t_hist', now(), '25 hours')$$, '22023', NULL,
    'dq_history_stats: a bucket over a day'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_stats('t_hist', '1990-01-01', '86399.5 seconds')$$, '22023',
    'pgdq: bucket must be whole seconds, got 23:59:59.5',
    'dq_history_stats: a bucket that is not whole seconds (1.3: it read the records of the whole range)'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_stats('t_hist', dq_now(), '1.5 seconds')$$, '22023',
    'pgdq: bucket must be whole seconds, got 00:00:01.5', 'dq_history_stats: a second and a half'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_stats('t_hist', dq_now() - interval '10000 seconds', '1 second')$$, '22023',
    'pgdq: since and bucket must span at most 10000 buckets up to now, got 10001 buckets of 00:00:01',
    'dq_history_stats: more than 10,000 buckets'
);
SELECT lives_ok(
    $$SELECT * FROM dq_history_stats('t_hist', dq_now() - interval '9999 seconds', '1 second')$$,
    'dq_history_stats: 10,000 buckets'
);
SELECT throws_ok(
    $$SELECT * FROM dq_history_stats('t_hist', now(), '1 mon -29 days')$$, '22023', NULL,
    'dq_history_stats: a bucket in months'
);

SELECT * FROM finish();
ROLLBACK;
