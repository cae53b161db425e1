-- dq_cancel, dq_get, dq_purge, dq_stats, dq_next_due.
BEGIN;
SELECT plan(30);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

-- empty queue
SELECT is(dq_next_due('t_mng'), NULL, 'dq_next_due of an empty queue is NULL');
SELECT results_eq(
    $$SELECT * FROM dq_stats('t_mng')$$,
    $$VALUES ('t_mng'::text, 0::bigint, 0::bigint, 0::bigint, NULL::timestamptz, NULL::timestamptz)$$,
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
              '2024-01-01 09:00:00+00'::timestamptz, '2024-01-01 11:00:00+00'::timestamptz)$$,
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
              NULL::text, 0)$$,
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

SELECT * FROM finish();
ROLLBACK;
