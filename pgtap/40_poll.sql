-- dq_poll / dq_poll_many: due order, ties by id, expired leases, lease
-- fields, max_count and lease rules, queue isolation.
BEGIN;
SELECT plan(35);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT dq_offer('t_poll', 'late', '"l"', '2024-01-01 09:59:00+00');
SELECT dq_offer('t_poll', 'early', '"e"', '2024-01-01 09:58:00+00');
SELECT dq_offer('t_poll', 'tie1', '"t1"', '2024-01-01 09:59:30+00');
SELECT dq_offer('t_poll', 'tie2', '"t2"', '2024-01-01 09:59:30+00');
SELECT dq_offer('t_poll', 'future', '"f"', '2024-01-01 10:30:00+00');
SELECT dq_offer('t_other', 'o', '"o"', '2024-01-01 09:00:00+00');

SELECT is((SELECT count(*)::int FROM dq_poll_many('t_poll', 0)), 0, 'max_count 0 returns nothing');
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_poll', -5)), 0, 'max_count < 0 returns nothing');
SELECT is((SELECT attempts FROM dq_get('t_poll', 'early')), 0, 'and leased nothing');

CREATE TEMP TABLE p1 AS SELECT * FROM dq_poll('t_poll', '30 seconds');
SELECT is((SELECT key FROM p1), 'early', 'dq_poll returns the earliest due message');
SELECT is((SELECT attempts FROM p1), 1, 'attempts is 1 on the first delivery');
SELECT ok(NOT (SELECT redelivery FROM p1), 'the first delivery is not a redelivery');
SELECT is((SELECT lease_until FROM p1), '2024-01-01 10:00:30+00'::timestamptz, 'leased until now + lease');
SELECT is((SELECT scheduled_at FROM p1), '2024-01-01 09:58:00+00'::timestamptz, 'scheduled_at is the offered time');
SELECT is((SELECT payload FROM p1), '"e"'::jsonb, 'the payload');
SELECT is((SELECT queue FROM p1), 't_poll', 'the queue');
SELECT is((SELECT created_at FROM p1), '2024-01-01 10:00:00+00'::timestamptz, 'created_at');
SELECT is((
    SELECT id FROM p1), (
    SELECT id FROM dq_messages
    WHERE queue = 't_poll' AND key = 'early'
), 'the stored id');
SELECT ok((SELECT lock_token IS NOT NULL FROM p1), 'a lock token');
SELECT ok((SELECT leased FROM dq_get('t_poll', 'early')), 'the message is leased');

SELECT results_eq(
    $$SELECT key FROM dq_poll_many('t_poll', 10, '1 minute')$$,
    $$VALUES ('late'), ('tie1'), ('tie2')$$,
    'dq_poll_many returns due messages earliest first, ties by id, not leased or future ones, not other queues'
);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_poll', 10)), 0, 'nothing left that is due');

-- expired leases are due again, ordered by lease_until
SELECT set_config('dq.now', '2024-01-01 10:00:45+00', TRUE);
CREATE TEMP TABLE p2 AS SELECT * FROM dq_poll_many('t_poll', 10, '1 minute');
SELECT results_eq($$SELECT key FROM p2$$, $$VALUES ('early')$$, 'a message whose lease expired is due again');
SELECT is((SELECT attempts FROM p2), 2, 'attempts counts the redelivery');
SELECT ok((SELECT redelivery FROM p2), 'redelivery is true when attempts > 1');
SELECT isnt((SELECT lock_token FROM p2), (SELECT lock_token FROM p1), 'a fresh lock token');
SELECT is((SELECT scheduled_at FROM p2), '2024-01-01 09:58:00+00'::timestamptz, 'leases do not move scheduled_at');
SELECT set_config('dq.now', '2024-01-01 10:03:00+00', TRUE);
SELECT results_eq(
    $$SELECT key FROM dq_poll_many('t_poll', 10, '1 minute')$$,
    $$VALUES ('late'), ('tie1'), ('tie2'), ('early')$$,
    'expired leases are ordered by lease_until'
);

-- lease rules and bad input
SELECT throws_ok($$SELECT * FROM dq_poll('t_poll', '0 seconds')$$, '22023', 'pgdq: lease must be positive, got 00:00:00', 'zero lease');
SELECT
    throws_ok(
        $$SELECT * FROM dq_poll_many('t_poll', 1, '-1 second')$$, '22023', 'pgdq: lease must be positive, got -00:00:01', 'negative lease'
    );
SELECT throws_ok($$SELECT * FROM dq_poll('t_poll', NULL)$$, '22004', 'pgdq: lease must not be NULL', 'NULL lease');
SELECT throws_ok($$SELECT * FROM dq_poll_many('t_poll', NULL)$$, '22004', 'pgdq: max_count must not be NULL', 'NULL max_count');
SELECT throws_ok($$SELECT * FROM dq_poll(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'NULL queue');
SELECT throws_ok($$SELECT * FROM dq_poll_many('', 1)$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0', 'empty queue');
SELECT is((SELECT attempts FROM dq_get('t_other', 'o')), 0, 'polls of one queue never touched another');
SELECT is(
    (SELECT lease_until - '2024-01-01 10:03:00+00'::timestamptz FROM dq_poll('t_other')), interval '5 minutes',
    'the default lease is 5 minutes'
);

-- a lease must end after now, within the timestamp range (api-v1.1)
SELECT set_config('dq.now', '2024-01-31 10:00:00+00', TRUE);
SELECT throws_ok(
    $$SELECT * FROM dq_poll('t_poll', '1 mon -29 days')$$, '22023',
    'pgdq: lease must end after now, but 1 mon -29 days from 2024-01-31 10:00:00+00 ends at 2024-01-31 10:00:00+00',
    'a lease that compares as positive but ends before now on this date'
);
SELECT throws_ok(
    $$SELECT * FROM dq_poll_many('t_poll', 5, '300000 years')$$, '22023',
    'pgdq: lease 300000 years ends after year 9999 UTC', 'a lease past the timestamp range'
);
SELECT throws_ok(
    $$SELECT * FROM dq_ack_poll('{}', 't_poll', 5, '1 mon -29 days')$$, '22023', NULL, 'dq_ack_poll checks its lease too'
);
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_poll', 1, '1 mon -28 days')), 1, 'a lease that does end after now works');
SELECT is(
    (SELECT count(*)::int FROM dq_poll_many('t_poll', 1, '2000 years')), 1, 'so does a long one within the range'
);

SELECT * FROM finish();
ROLLBACK;
