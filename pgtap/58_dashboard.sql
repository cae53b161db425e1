-- What operators look for (1.3, the dashboard's): dq_deliveries,
-- dq_delivery_of, dq_release (a stuck lease released without its token) and
-- dq_dead_counts (failures over time, history kept or not).
BEGIN;
SELECT plan(30);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- a: leased at 10:00 for an hour; b: leased at 10:05 and nacked with an error;
-- c: never delivered; d: channeled, leased at 10:06
SELECT dq_offer('t_dash', 'a', '1', '2024-01-01 09:00+00');
CREATE TEMP TABLE la AS SELECT * FROM dq_poll('t_dash', '1 hour');
SELECT set_config('dq.now', '2024-01-01 10:05:00+00', TRUE);
SELECT dq_offer('t_dash', 'b', '2', '2024-01-01 09:00+00');
SELECT dq_nack((SELECT lock_token FROM dq_poll('t_dash', '1 minute')), '2024-01-01 10:30+00', NULL, 'boom
at line 2
ValueError: bad');
SELECT dq_offer('t_dash', 'c', '3', '2024-01-01 12:00+00');
SELECT set_config('dq.now', '2024-01-01 10:06:00+00', TRUE);
SELECT dq_offer('t_dash', 'd', '4', '2024-01-01 09:00+00', TRUE, 'ch');
CREATE TEMP TABLE ld AS SELECT * FROM dq_poll('t_dash', '10 minutes');

SELECT results_eq(
    $$SELECT key, channel, attempts, leased_at, due_at FROM dq_deliveries('t_dash', 'running')$$,
    $$VALUES ('a', NULL, 1, '2024-01-01 10:00+00'::timestamptz, '2024-01-01 11:00+00'::timestamptz),
        ('d', 'ch', 1, '2024-01-01 10:06+00', '2024-01-01 10:16+00')$$,
    'dq_deliveries running: the leases that run, oldest delivery first, channeled ones too'
);
SELECT results_eq(
    $$SELECT key, attempts, leased_at, due_at, last_error FROM dq_deliveries('t_dash', 'retrying')$$,
    $$VALUES ('b', 1, '2024-01-01 10:05+00'::timestamptz, '2024-01-01 10:30+00'::timestamptz,
        E'boom\nat line 2\nValueError: bad')$$,
    'dq_deliveries retrying: tried, not leased, with its last error whole'
);
SELECT is((SELECT count(*)::int FROM dq_deliveries('t_dash', 'running', 1)), 1, 'dq_deliveries running: max_count');
SELECT is(
    (SELECT row(key, attempts, due_at, last_error)::text FROM dq_delivery_of('t_dash', (SELECT id FROM la))),
    row('a', 1, '2024-01-01 11:00+00'::timestamptz, NULL::text)::text,
    'dq_delivery_of: one live message by id'
);
CREATE TEMP TABLE lb AS
SELECT id FROM dq_messages
WHERE queue = 't_dash' AND key = 'b';
SELECT is(
    (SELECT last_error FROM dq_delivery_of('t_dash', (SELECT id FROM lb))),
    E'boom\nat line 2\nValueError: bad',
    'dq_delivery_of: its last error'
);
SELECT is((SELECT count(*)::int FROM dq_delivery_of('t_other', (SELECT id FROM la))), 0, 'dq_delivery_of: another queue''s id is none');

-- an expired lease is neither running nor (until it is leased again) more than ready
SELECT set_config('dq.now', '2024-01-01 10:20:00+00', TRUE);
SELECT is(
    (SELECT array_agg(key ORDER BY key) FROM dq_deliveries('t_dash', 'running')), ARRAY['a'], 'a lease that ended is not running'
);
SELECT is(
    (SELECT array_agg(key ORDER BY key) FROM dq_deliveries('t_dash', 'retrying')), ARRAY['b', 'd'],
    'and is retrying (tried, not leased)'
);

-- dq_release: a stuck lease without its token
SELECT is(dq_release('t_other', (SELECT id FROM la)), FALSE, 'dq_release: another queue''s id changes nothing');
SELECT is(dq_release('t_dash', (SELECT id FROM ld)), FALSE, 'dq_release: a lease that ended is not released');
SELECT is(dq_release('t_dash', (SELECT id FROM la)), TRUE, 'dq_release of a running lease: true');
SELECT results_eq(
    $$SELECT lock_token IS NULL, due_at, attempts FROM dq_messages WHERE queue = 't_dash' AND key = 'a'$$,
    $$VALUES (TRUE, '2024-01-01 10:20+00'::timestamptz, 1)$$,
    'the message is due now, its attempts kept'
);
SELECT is(dq_ack((SELECT lock_token FROM la)), FALSE, 'its holder''s ack fails');
SELECT is((SELECT ready::int FROM dq_stats('t_dash')), 2, 'the counts follow (a and d ready)');
SELECT is((SELECT key FROM dq_poll('t_dash', '1 minute')), 'a', 'and a poll leases it again');
UPDATE dq_messages SET last_error = 'kept'
WHERE queue = 't_dash' AND key = 'a';
SELECT dq_release('t_dash', (SELECT id FROM la));
SELECT is(
    (
        SELECT last_error FROM dq_messages
        WHERE queue = 't_dash' AND key = 'a'
    ),
    'kept',
    'dq_release keeps the last error'
);
SELECT is(dq_release('t_dash', (SELECT id FROM la)), FALSE, 'releasing it again: false');

-- dq_dead_counts: dead letters per bucket by their failure time
SELECT set_config('dq.now', '2024-01-01 10:00:30+00', TRUE);
SELECT dq_offer('t_dash_d', k, '1', '2024-01-01 09:00+00') FROM unnest(ARRAY['x', 'y', 'z']) AS k;
SELECT dq_dead_letter(lock_token, 'gone') FROM dq_poll_many('t_dash_d', 2);
SELECT set_config('dq.now', '2024-01-01 10:02:10+00', TRUE);
SELECT dq_dead_letter(lock_token, 'gone') FROM dq_poll_many('t_dash_d', 1);
SELECT dq_offer('t_dash_e', 'w', '1', '2024-01-01 09:00+00');
SELECT dq_dead_letter(lock_token, 'gone') FROM dq_poll_many('t_dash_e', 1);
SELECT results_eq(
    $$SELECT queue, bucket_at, dead FROM dq_dead_counts('t_dash_d', '2024-01-01 09:30+00', '1 minute')$$,
    $$VALUES ('t_dash_d', '2024-01-01 10:00+00'::timestamptz, 2::bigint), ('t_dash_d', '2024-01-01 10:02+00', 1)$$,
    'dq_dead_counts of a queue: per minute of failure, only minutes with some'
);
SELECT results_eq(
    $$SELECT queue, bucket_at, dead FROM dq_dead_counts(NULL, '2024-01-01 10:01+00', '1 hour')
        WHERE queue LIKE 't\_dash\__'$$,
    $$VALUES ('t_dash_d', '2024-01-01 10:00+00'::timestamptz, 3::bigint), ('t_dash_e', '2024-01-01 10:00+00', 1)$$,
    'of every queue (NULL), from the bucket holding since'
);
SELECT dq_dead_purge('t_dash_e');
SELECT is(
    (SELECT count(*)::int FROM dq_dead_counts('t_dash_e', '2024-01-01 09:30+00', '1 minute')), 0,
    'a purged dead letter is no longer counted'
);

-- bad input: 22023 / 22004 naming the argument
SELECT throws_ok(
    $$SELECT * FROM dq_deliveries('t_dash', 'running', 0)$$, '22023', 'pgdq: max_count must be 1 to 1000, got 0',
    'dq_deliveries: max_count 0'
);
SELECT throws_ok($$SELECT * FROM dq_deliveries('', 'retrying', 5)$$, '22023', NULL, 'dq_deliveries: an empty queue name');
SELECT throws_ok($$SELECT * FROM dq_deliveries('t_dash', 'stuck')$$, '22023', NULL, 'dq_deliveries: an unknown which');
SELECT throws_ok($$SELECT * FROM dq_deliveries('t_dash', NULL)$$, '22004', NULL, 'dq_deliveries: which NULL');
SELECT throws_ok($$SELECT * FROM dq_delivery_of('t_dash', NULL)$$, '22004', NULL, 'dq_delivery_of: id NULL');
SELECT throws_ok($$SELECT dq_release('t_dash', NULL)$$, '22004', NULL, 'dq_release: id NULL');
SELECT throws_ok(
    $$SELECT * FROM dq_dead_counts(NULL, NULL, '1 minute')$$, '22004', NULL, 'dq_dead_counts: since NULL'
);
SELECT throws_ok(
    $$SELECT * FROM dq_dead_counts(NULL, '2024-01-01', '30 seconds')$$, '22023',
    'pgdq: bucket must be from 1 minute to 1 day, at most 10000 of them since since, got 00:00:30',
    'dq_dead_counts: a bucket under a minute'
);
SELECT throws_ok(
    $$SELECT * FROM dq_dead_counts(NULL, '2000-01-01', '1 minute')$$, '22023', NULL,
    'dq_dead_counts: over 10000 buckets'
);
SELECT throws_ok(
    $$SELECT * FROM dq_dead_counts(NULL, 'infinity', '1 minute')$$, '22023', NULL, 'dq_dead_counts: an infinite since'
);

SELECT * FROM finish();
ROLLBACK;
