-- dq_cancel, dq_get, dq_purge, dq_stats, dq_next_due.
BEGIN;
SELECT plan(41);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- empty queue
SELECT is(dq_next_due('t_mng'), NULL, 'dq_next_due of an empty queue is NULL');
SELECT results_eq(
    $$SELECT * FROM dq_stats('t_mng')$$,
    $$VALUES ('t_mng'::text, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::timestamptz, FALSE)$$,
    'dq_stats of a named empty queue is one row of zeros'
);
SELECT is((
    SELECT count(*)::int FROM dq_stats()
    WHERE queue = 't_mng'
), 0, 'dq_stats() lists only queues with messages');

SELECT dq_offer('t_mng', 'ready1', '1', '2024-01-01 09:00:00+00');
SELECT dq_offer('t_mng', 'ready2', '2', '2024-01-01 09:30:00+00');
SELECT dq_offer('t_mng', 'later', '3', '2024-01-01 11:00:00+00');
SELECT dq_offer('t_mng', 'much_later', '4', '2024-01-02 11:00:00+00');
SELECT dq_offer('t_mng', 'lease_me', '5', '2024-01-01 08:00:00+00');
SELECT dq_offer('t_mng2', 'x', '6');
SELECT is((SELECT key FROM dq_poll('t_mng', '10 minutes')), 'lease_me', 'leased one');
SELECT dq_offer('t_mng', 'expire_me', '7', '2024-01-01 07:00:00+00');
SELECT is((SELECT key FROM dq_poll('t_mng', '1 minute')), 'expire_me', 'leased another');

SELECT is(dq_next_due('t_mng'), '2024-01-01 09:00:00+00'::timestamptz, 'dq_next_due is the earliest due time');
SELECT set_config('dq.now', '2024-01-01 10:02:00+00', TRUE);  -- expire_me's lease has expired
SELECT results_eq(
    $$SELECT * FROM dq_stats('t_mng')$$,
    $$VALUES ('t_mng'::text, 3::bigint, 2::bigint, 1::bigint,
              '2024-01-01 09:00:00+00'::timestamptz, '2024-01-01 11:00:00+00'::timestamptz, FALSE)$$,
    'ready (expired lease included), delayed, leased, oldest ready and next due'
);
SELECT results_eq(
    $$SELECT queue, ready FROM dq_stats() WHERE queue IN ('t_mng', 't_mng2')$$,
    $$VALUES ('t_mng'::text, 3::bigint), ('t_mng2'::text, 1::bigint)$$, 'dq_stats() has one row per queue'
);

-- dq_get
SELECT results_eq(
    $$SELECT * FROM dq_get('t_mng', 'lease_me')$$,
    $$VALUES ('t_mng'::text, 'lease_me'::text, '5'::jsonb, NULL::jsonb, '2024-01-01 08:00:00+00'::timestamptz,
              '2024-01-01 10:10:00+00'::timestamptz, 1, true, '2024-01-01 10:00:00+00'::timestamptz,
              NULL::text, 0, NULL::jsonb)$$,
    'dq_get of a leased message: due_at is lease_until, leased is true'
);
SELECT is((SELECT leased FROM dq_get('t_mng', 'expire_me')), FALSE, 'leased is false once the lease ran out');
SELECT is((SELECT due_at FROM dq_get('t_mng', 'later')), '2024-01-01 11:00:00+00'::timestamptz, 'due_at of a delayed message');
SELECT is((SELECT count(*)::int FROM dq_get('t_mng', 'nope')), 0, 'dq_get of a missing key: no row');
SELECT is((SELECT attempts FROM dq_get('t_mng', 'ready1')), 0, 'dq_get changes nothing');
SELECT is(
    (
        SELECT count(*)::int FROM dq_poll_many('t_mng', 10, '1 second')
        WHERE key = 'expire_me'
    ), 1,
    'dq_get does not lock: the message can still be polled'
);
SELECT throws_ok($$SELECT * FROM dq_get(NULL, 'k')$$, '22004', 'pgdq: queue must not be NULL', 'dq_get: NULL queue');
SELECT throws_ok($$SELECT * FROM dq_get('q', '')$$, '22023', 'pgdq: key must be 1 to 200 characters long, got 0', 'dq_get: empty key');

-- dq_next_due counts leases by lease_until
SELECT dq_offer('t_nd', 'a', '1', '2024-01-01 10:00:00+00');
SELECT dq_offer('t_nd', 'b', '1', '2024-01-01 12:00:00+00');
SELECT is((SELECT key FROM dq_poll('t_nd', '30 minutes')), 'a', 'leased a');
SELECT is(dq_next_due('t_nd'), '2024-01-01 10:32:00+00'::timestamptz, 'dq_next_due counts a leased message by lease_until');
SELECT throws_ok($$SELECT dq_next_due(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'dq_next_due: NULL queue');

-- dq_cancel
SELECT ok(dq_cancel('t_mng', 'lease_me'), 'cancel deletes a leased message');
SELECT ok(dq_cancel('t_mng', 'later'), 'cancel deletes a delayed message');
SELECT ok(NOT dq_cancel('t_mng', 'later'), 'cancel of a missing key is false');
SELECT is((SELECT count(*)::int FROM dq_get('t_mng', 'later')), 0, 'the message is gone');
SELECT throws_ok($$SELECT dq_cancel('t_mng', NULL)$$, '22004', 'pgdq: key must not be NULL', 'dq_cancel: NULL key');
SELECT
    throws_ok(
        $$SELECT dq_cancel(repeat('x', 101), 'k')$$,
        '22023',
        'pgdq: queue must be 1 to 100 characters long, got 101',
        'dq_cancel: long queue'
    );

-- dq_purge
SELECT is(dq_purge('t_mng'), 4::bigint, 'purge deletes every message of the queue and counts them');
SELECT is(dq_purge('t_mng'), 0::bigint, 'purging an empty queue is 0');
SELECT is((SELECT ready FROM dq_stats('t_mng2')), 1::bigint, 'other queues are untouched');
SELECT throws_ok($$SELECT dq_purge(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'dq_purge: NULL queue');
SELECT throws_ok($$SELECT * FROM dq_stats('')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0', 'dq_stats: empty queue');

-- dq_due_hours: messages per hour from now, a lease at its end, channels too
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
SELECT dq_offer('t_hours', 'now', '1', '2024-01-01 10:00:00+00');  -- due now: not in any hour
SELECT dq_offer('t_hours', 'h0', '1', '2024-01-01 10:30:00+00');
SELECT dq_offer('t_hours', 'h2a', '1', '2024-01-01 12:00:00+00');
SELECT dq_offer('t_hours', 'h2b', '1', '2024-01-01 12:59:00+00', channel => 'c');
SELECT dq_offer('t_hours', 'h2c', '1', '2024-01-01 12:10:00+00', priority => 3);
SELECT dq_offer('t_hours', 'h3', '1', '2024-01-01 13:00:00+00');  -- the fourth hour
SELECT dq_offer('t_hours', 'next_day', '1', '2024-01-02 10:00:00+00');
SELECT dq_offer('t_hours_other', 'h0', '1', '2024-01-01 10:30:00+00');
SELECT is((SELECT key FROM dq_poll('t_hours', '90 minutes')), 'now', 'leased the due one for 90 minutes');
SELECT results_eq(
    $$SELECT hour_start, due FROM dq_due_hours('t_hours', 4)$$,
    $$VALUES
        ('2024-01-01 10:00:00+00'::timestamptz, 1::bigint),
        ('2024-01-01 11:00:00+00', 1),
        ('2024-01-01 12:00:00+00', 3),
        ('2024-01-01 13:00:00+00', 1)$$,
    'dq_due_hours: one row per hour from now, the lease at its end, grouped messages too'
);
SELECT is((SELECT sum(due)::int FROM dq_due_hours('t_hours')), 6, 'by default the next 24 hours');
SELECT is((SELECT count(*)::int FROM dq_due_hours('t_empty_hours', 168)), 168, 'an empty queue has a row of 0 per hour');
SELECT throws_ok(
    $$SELECT * FROM dq_due_hours('t_hours', 169)$$, '22023', 'pgdq: hours must be 1 to 168, got 169', 'dq_due_hours: hours'
);
SELECT throws_ok(
    $$SELECT * FROM dq_due_hours(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'dq_due_hours: NULL queue'
);

-- dq_key_queues: every queue holding the key, by name
SELECT results_eq(
    $$SELECT * FROM dq_key_queues('h0')$$,
    $$VALUES ('t_hours'::text), ('t_hours_other')$$,
    'dq_key_queues names every queue with a message of the key'
);
SELECT is_empty($$SELECT * FROM dq_key_queues('nowhere')$$, 'and none for a key no queue has');
SELECT throws_ok($$SELECT * FROM dq_key_queues(NULL)$$, '22004', 'pgdq: key must not be NULL', 'dq_key_queues: NULL key');

-- dq_dead_stats: per queue with dead letters
SELECT dq_offer('t_dead_stats', k, '1') FROM (VALUES ('a'), ('b'), ('c')) AS v (k);
SELECT dq_dead_letter(lock_token, 'boom') FROM dq_poll_many('t_dead_stats', 2);
SELECT results_eq(
    $$SELECT * FROM dq_dead_stats()$$,
    $$VALUES ('t_dead_stats'::text, 2::bigint, '2024-01-01 10:00:00+00'::timestamptz)$$,
    'dq_dead_stats: one row per queue with dead letters'
);
SELECT is_empty($$SELECT * FROM dq_dead_stats('t_hours')$$, 'none for a queue without');

SELECT * FROM finish();
ROLLBACK;
