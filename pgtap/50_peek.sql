-- dq_peek: a read-only browse of one queue, by condition, due time then key;
-- no lock tokens, no locks, no changes; bad input.
BEGIN;
SELECT plan(22);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

SELECT dq_offer('t_peek', 'ready_b', '1', '2024-01-01 09:00:00+00');
SELECT dq_offer('t_peek', 'ready_a', '2', '2024-01-01 09:00:00+00');
SELECT dq_offer('t_peek', 'later', '3', '2024-01-01 11:00:00+00');
SELECT dq_offer('t_peek', 'lease_me', '4', '2024-01-01 08:00:00+00');
SELECT dq_offer('t_peek', 'expire_me', '5', '2024-01-01 07:00:00+00');
SELECT dq_offer('t_peek_other', 'x', '6');
SELECT is(
    (SELECT array_agg(d.key ORDER BY d.key) FROM dq_poll_many('t_peek', 2, '1 minute') AS d),
    ARRAY['expire_me', 'lease_me'], 'two messages leased'
);
SELECT is(
    dq_nack((SELECT lock_token FROM dq_poll('t_peek', '1 minute')), '2024-01-01 09:00:00+00', '{"step": 1}', 'boom'),
    TRUE, 'ready_b leased and nacked with an error'
);
SELECT dq_extend(
    (
        SELECT m.lock_token FROM dq_messages AS m
        WHERE m.queue = 't_peek' AND m.key = 'lease_me'
    ), '10 minutes'
);
SELECT set_config('dq.now', '2024-01-01 10:02:00+00', TRUE);  -- expire_me's lease ran out

SELECT results_eq(
    $$SELECT key, due_at, leased, lease_until FROM dq_peek('t_peek')$$,
    $$VALUES ('ready_a'::text, '2024-01-01 09:00:00+00'::timestamptz, FALSE, NULL::timestamptz),
             ('ready_b', '2024-01-01 09:00:00+00', FALSE, NULL),
             ('expire_me', '2024-01-01 10:01:00+00', FALSE, NULL),
             ('lease_me', '2024-01-01 10:10:00+00', TRUE, '2024-01-01 10:10:00+00'),
             ('later', '2024-01-01 11:00:00+00', FALSE, NULL)$$,
    'NULL: every message of the queue, by due time then key; lease_until only while leased'
);
SELECT results_eq(
    $$SELECT key FROM dq_peek('t_peek', 'due')$$,
    $$VALUES ('ready_a'::text), ('ready_b'), ('expire_me')$$,
    'due: ready now, an expired lease included'
);
SELECT results_eq($$SELECT key FROM dq_peek('t_peek', 'delayed')$$, $$VALUES ('later'::text)$$, 'delayed: not yet due, not leased');
SELECT results_eq($$SELECT key FROM dq_peek('t_peek', 'leased')$$, $$VALUES ('lease_me'::text)$$, 'leased: lease_until > now');
SELECT results_eq(
    $$SELECT key FROM dq_peek('t_peek', NULL, 2)$$, $$VALUES ('ready_a'::text), ('ready_b')$$,
    'max_count caps the rows'
);
SELECT is((SELECT count(*)::int FROM dq_peek('t_peek', NULL, 1000)), 5, 'max_count 1000 is allowed');
SELECT is((SELECT count(*)::int FROM dq_peek('t_peek_none')), 0, 'an unknown queue: no rows');

-- what it shows
SELECT results_eq(
    $$SELECT payload, state, scheduled_at, attempts, last_error FROM dq_peek('t_peek') WHERE key = 'ready_a'$$,
    $$VALUES ('2'::jsonb, NULL::jsonb, '2024-01-01 09:00:00+00'::timestamptz, 0, NULL::text)$$,
    'payload, state, scheduled_at and attempts as stored'
);
SELECT results_eq(
    $$SELECT state, attempts, last_error FROM dq_peek('t_peek') WHERE key = 'ready_b'$$,
    $$VALUES ('{"step": 1}'::jsonb, 1, 'boom'::text)$$,
    'a nacked message shows its state, attempts and last_error'
);
SELECT is(
    (
        SELECT p.proargnames FROM pg_proc AS p
        WHERE p.proname = 'dq_peek'
    ),
    ARRAY[
        'queue', 'which', 'max_count', 'key', 'payload', 'state', 'scheduled_at', 'due_at', 'attempts', 'leased',
        'lease_until', 'last_error', 'id', 'headers'
    ],
    'no lock_token column: a browse never hands out deliveries'
);

-- read only: STABLE (PostgreSQL refuses FOR UPDATE and writes in it), rows untouched
SELECT is((
    SELECT p.provolatile::text FROM pg_proc AS p
    WHERE p.proname = 'dq_peek'
), 's', 'dq_peek is STABLE');
CREATE TEMP TABLE before_peek AS
SELECT
    m.key,
    m.xmin::text AS row_xmin,
    m.xmax::text AS row_xmax,
    m.ctid AS row_ctid
FROM dq_messages AS m
WHERE m.queue = 't_peek';
SELECT count(*) FROM dq_peek('t_peek', NULL, 1000) AS p;  -- noqa: AL05
SELECT set_config('dq.now', '2024-02-01 00:00:00+00', TRUE);  -- all due, leases run out
SELECT count(*) FROM dq_peek('t_peek', 'due') AS p;  -- noqa: AL05
SELECT results_eq(
    $$SELECT m.key, m.xmin::text, m.xmax::text, m.ctid FROM dq_messages AS m WHERE m.queue = 't_peek' ORDER BY m.key$$,
    $$SELECT key, row_xmin, row_xmax, row_ctid FROM before_peek ORDER BY key$$,
    'peeking changes no row (same versions)'
);
SELECT set_config('dq.now', '2024-01-01 10:02:00+00', TRUE);

-- bad input
SELECT throws_ok(
    $$SELECT * FROM dq_peek('t_peek', 'soon')$$, '22023',
    'pgdq: which must be one of ''due'', ''delayed'', ''leased'', got ''soon''', 'an unknown which: 22023 naming it'
);
SELECT throws_ok(
    $$SELECT * FROM dq_peek('t_peek', 'Due')$$, '22023', NULL, 'which is case sensitive'
);
SELECT throws_ok(
    $$SELECT * FROM dq_peek('t_peek', NULL, 0)$$, '22023', 'pgdq: max_count must be 1 to 1000, got 0',
    'max_count 0: 22023'
);
SELECT throws_ok(
    $$SELECT * FROM dq_peek('t_peek', NULL, 1001)$$, '22023', 'pgdq: max_count must be 1 to 1000, got 1001',
    'max_count over 1000: 22023'
);
SELECT throws_ok(
    $$SELECT * FROM dq_peek('t_peek', NULL, NULL)$$, '22004', 'pgdq: max_count must not be NULL',
    'max_count NULL: 22004'
);
SELECT throws_ok(
    $$SELECT * FROM dq_peek('')$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0',
    'an empty queue name: 22023'
);
SELECT throws_ok($$SELECT * FROM dq_peek(NULL)$$, '22004', 'pgdq: queue must not be NULL', 'queue NULL: 22004');
SELECT set_config('dq.now', 'infinity', TRUE);
SELECT throws_ok(
    $$SELECT * FROM dq_peek('t_peek_none')$$, '22023', 'pgdq: dq.now must be a finite timestamp in years 1 to 9999 UTC, got ''infinity''',
    'an invalid dq.now fails it, row or no row'
);

SELECT * FROM finish();
ROLLBACK;
