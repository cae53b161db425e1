-- Dead letters and per-queue settings (additions to api-v1): dq_configure,
-- dq_dead_letter, max_attempts enforced by polls, dq_dead_list,
-- dq_dead_redrive, dq_dead_purge.
BEGIN;
SELECT plan(44);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- dq_dead_letter: the consumer gives up
SELECT dq_offer('t_dl', 'a', '{"v": 1}');
CREATE TEMP TABLE d1 AS SELECT * FROM dq_poll('t_dl', '1 minute');
SELECT ok(dq_dead_letter((SELECT lock_token FROM d1), 'boom'), 'dead-letter with the current token');
SELECT is((SELECT count(*)::int FROM dq_get('t_dl', 'a')), 0, 'the message left the queue');
SELECT is(
    (SELECT row(key, payload, attempts, error, failed_at)::text FROM dq_dead_list('t_dl')),
    row('a', '{"v": 1}'::jsonb, 1, 'boom', '2024-01-01 10:00:00+00'::timestamptz)::text,
    'and is a dead letter with its payload, attempts, error and time'
);
SELECT ok(NOT dq_dead_letter((SELECT lock_token FROM d1), 'again'), 'a stale token dead-letters nothing');
SELECT ok(NOT dq_dead_letter(NULL), 'a NULL token is stale');
SELECT is((SELECT error FROM dq_dead_list('t_dl')), 'boom', 'the stale call changed nothing');

-- tokens in their queue (1.2): given another queue, the token is stale and
-- the message stays leased as it was; given its own, it dead-letters
SELECT dq_offer('t_dl_b', 'b', '{"v": 1}');
CREATE TEMP TABLE db AS SELECT * FROM dq_poll('t_dl_b', '1 minute');
SELECT ok(NOT dq_dead_letter((SELECT lock_token FROM db), 'boom', 't_dl'), 'a token of another queue is stale');
SELECT results_eq(
    $$SELECT lock_token, due_at, attempts FROM dq_messages WHERE queue = 't_dl_b'$$,
    $$SELECT lock_token, lease_until, attempts FROM db$$,
    'and its message is still leased, with the same attempts'
);
SELECT is((SELECT count(*)::int FROM dq_dead_list('t_dl_b')), 0, 'and no dead letter');
SELECT throws_ok(
    format('SELECT dq_dead_letter(%L, NULL, %L)', (SELECT lock_token FROM db), repeat('q', 101)), '22023',
    'pgdq: queue must be 1 to 100 characters long, got 101', 'a queue too long is 22023'
);
SELECT ok(dq_dead_letter((SELECT lock_token FROM db), 'boom', 't_dl_b'), 'given its own queue it dead-letters');
SELECT is((SELECT count(*)::int FROM dq_dead_list('t_dl_b')), 1, 'a dead letter of t_dl_b');

-- the same key fails again: its dead letter is replaced
SELECT dq_offer('t_dl', 'a', '{"v": 2}');
CREATE TEMP TABLE d2 AS SELECT * FROM dq_poll('t_dl', '1 minute');
SELECT ok(dq_dead_letter((SELECT lock_token FROM d2)), 'dead-letter the new version (no error text)');
SELECT is(
    (SELECT array_agg(row(payload, error)::text) FROM dq_dead_list('t_dl')),
    ARRAY[row('{"v": 2}'::jsonb, NULL::text)::text],
    'one dead letter per key: the latest failure'
);

-- max_attempts: a poll buries a message whose consumers kept dying
SELECT lives_ok($$SELECT dq_configure('t_max', 2)$$, 'configure max_attempts');
SELECT dq_offer_many('t_max', ARRAY['m1', 'm2'], ARRAY['1', '2']::jsonb[]);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_max', 10, '1 minute')), 2, 'first delivery');
SELECT set_config('dq.now', '2024-01-01 10:02:00+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_max', 10, '1 minute')), 2, 'second delivery after the leases expired');
SELECT set_config('dq.now', '2024-01-01 10:04:00+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_max', 10, '1 minute')), 0, 'no third delivery');
SELECT is(
    (SELECT array_agg(key || ':' || attempts ORDER BY key) FROM dq_dead_list('t_max')),
    ARRAY['m1:2', 'm2:2'],
    'both are dead letters after max_attempts deliveries'
);
SELECT matches((SELECT error FROM dq_dead_list('t_max', 1)), 'max_attempts', 'the error says why');
SELECT is((SELECT ready + delayed + leased FROM dq_stats('t_max')), 0::bigint, 'the queue is empty');
SELECT dq_offer('t_max', 'm3', '3');
SELECT lives_ok($$SELECT dq_configure('t_max', NULL)$$, 'NULL removes the limit');
SELECT is((SELECT count(*)::int FROM dq_poll('t_max', '1 second')), 1, 'delivered');
SELECT set_config('dq.now', '2024-01-01 10:05:00+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll('t_max', '1 second')), 1, 'delivered again');
SELECT set_config('dq.now', '2024-01-01 10:06:00+00', TRUE);
SELECT is((SELECT attempts FROM dq_poll('t_max', '1 second')), 3, 'and again: no limit');

-- redrive
SELECT dq_offer('t_max', 'm2', '"live again"');
SELECT is(dq_dead_redrive('t_max'), 1, 'redrive re-offers the dead letters whose key is not live');
SELECT is(
    (SELECT row(payload, attempts, state)::text FROM dq_get('t_max', 'm1')),
    row('1'::jsonb, 0, NULL::jsonb)::text,
    'fresh: same payload, no attempts, no state'
);
SELECT is(
    (SELECT array_agg(key) FROM dq_dead_list('t_max')), ARRAY['m2'],
    'a dead letter whose key is live again stays'
);
SELECT is(dq_dead_redrive('t_dl', 'a', '2024-01-02 00:00:00+00'), 1, 'redrive one key at a time');
SELECT is((SELECT scheduled_at FROM dq_get('t_dl', 'a')), '2024-01-02 00:00:00+00'::timestamptz, 'due when asked');
SELECT is(dq_dead_redrive('t_dl', 'nope'), 0, 'an unknown key redrives nothing');

-- purge
SELECT is(dq_dead_purge('t_max', 'm2'), 1::bigint, 'purge one key');
SELECT is(dq_dead_purge('t_max'), 0::bigint, 'purge a queue with none left');

-- bad input: clear errors, nothing written
SELECT throws_ok($$SELECT dq_configure('t_bad', 0)$$, '22023', NULL, 'max_attempts must be positive');
SELECT throws_ok($$SELECT dq_configure(NULL, 3)$$, '22004', NULL, 'queue must not be NULL');
SELECT throws_ok($$SELECT * FROM dq_dead_list('', 10)$$, '22023', NULL, 'dead_list checks the queue');

-- infinite times (api-v1.1)
SELECT throws_ok(
    $$SELECT dq_dead_redrive('t_dl', NULL, 'infinity')$$, '22023',
    'pgdq: scheduled_at must be a time in years 1 to 9999 UTC, got infinity', 'redrive to an infinite time is 22023'
);

-- a bury says how the last delivery ended: nacked, or its lease expired
SELECT dq_configure('t_max_why', 1);
SELECT dq_offer_many('t_max_why', ARRAY['nacked', 'expired'], ARRAY['1', '2']::jsonb[]);
CREATE TEMP TABLE why AS SELECT * FROM dq_poll_many('t_max_why', 10, '1 minute');
SELECT dq_nack((
    SELECT lock_token FROM why
    WHERE key = 'nacked'
));
SELECT set_config('dq.now', '2024-01-01 10:10:00+00', TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_max_why', 10, '1 minute')), 0, 'no delivery past max_attempts');
SELECT is(
    (SELECT array_agg(key || ': ' || error ORDER BY key) FROM dq_dead_list('t_max_why')),
    ARRAY[
        'expired: pgdq: gave up after 1 deliveries (max_attempts 1): the last lease expired without an ack or nack',
        'nacked: pgdq: gave up after 1 deliveries (max_attempts 1): the last delivery was nacked'
    ],
    'one bury, each dead letter with how its last delivery ended'
);

-- a bury tells the last nack's error (1.1)
SELECT dq_configure('t_max_err', 1);
SELECT dq_offer('t_max_err', 'expired', '1');
SELECT dq_offer('t_max_err', 'nacked', '2');
SELECT dq_nack(d.lock_token, NULL, NULL, 'ValueError: bad row 7')
FROM dq_poll_many('t_max_err', 10, '1 minute') AS d;
SELECT dq_configure('t_max_err', 2);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_max_err', 1, '1 minute')), 1, 'expired leased again');
SELECT dq_configure('t_max_err', 1);
SELECT set_config('dq.now', (dq_now() + interval '2 minutes')::text, TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_max_err', 10, '1 minute')), 0, 'both buried');
SELECT results_eq(
    $$SELECT key, error FROM dq_dead_list('t_max_err') ORDER BY key$$,
    $$VALUES
        ('expired'::text, 'pgdq: gave up after 1 deliveries (max_attempts 1): the last lease expired without an ack or nack; '
            || 'an earlier delivery was nacked: ValueError: bad row 7'),
        ('nacked', 'pgdq: gave up after 1 deliveries (max_attempts 1): the last delivery was nacked: ValueError: bad row 7')$$,
    'the dead letter gives the last nack''s error, and says when a later lease expired'
);
SELECT dq_offer('t_max_err', 'verdict', '3');
SELECT dq_configure('t_max_err', NULL);
SELECT dq_nack(lock_token, NULL, NULL, 'first try') FROM dq_poll('t_max_err', '1 minute');
SELECT is(dq_dead_letter(lock_token), TRUE, 'dq_dead_letter without an error') FROM dq_poll('t_max_err', '1 minute');
SELECT is(
    (
        SELECT error FROM dq_dead_list('t_max_err')
        WHERE key = 'verdict'
    ), NULL,
    'keeps the consumer''s verdict as given, not an earlier nack''s error'
);

SELECT * FROM finish();
ROLLBACK;
