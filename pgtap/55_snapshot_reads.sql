-- dq_read_messages, dq_read_dead_letters, dq_read_bounds: id ranges of one
-- queue or every queue, by id, with the test clock; bad input.
BEGIN;
SELECT plan(20);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);
DELETE FROM dq_messages;  -- every queue's rows are read: start empty (rolled back)
DELETE FROM dq_dead_letters;

SELECT results_eq(
    $$SELECT * FROM dq_read_bounds('messages', NULL)$$, $$VALUES (NULL::bigint, NULL::bigint)$$,
    'no messages: one row of NULL bounds'
);
SELECT dq_offer('t_read', 'a', '1');
SELECT dq_offer('t_read', 'b', '2', '2024-01-02');
SELECT dq_offer('t_read2', 'c', '3');
SELECT dq_offer('t_read', 'd', '4');
CREATE TEMP TABLE ids AS SELECT
    m.key,
    m.id
FROM dq_messages AS m;
CREATE FUNCTION pg_temp.id_of(k text) RETURNS bigint LANGUAGE sql AS $$ SELECT i.id FROM ids AS i WHERE i.key = k $$;
SELECT is((SELECT key FROM dq_poll('t_read2', '1 minute')), 'c', 'c leased for a minute');

SELECT results_eq(
    $$SELECT * FROM dq_read_bounds('messages', NULL)$$,
    $$SELECT pg_temp.id_of('a'), pg_temp.id_of('d')$$,
    'bounds of every queue: the lowest and highest id'
);
SELECT results_eq(
    $$SELECT * FROM dq_read_bounds('messages', 't_read2')$$,
    $$SELECT pg_temp.id_of('c'), pg_temp.id_of('c')$$,
    'bounds of one queue'
);
SELECT results_eq(
    $$SELECT key FROM dq_read_messages(NULL, NULL, NULL)$$,
    $$VALUES ('a'::text), ('b'), ('c'), ('d')$$,
    'every queue, unbounded: every message, by id'
);
SELECT results_eq(
    format('SELECT key FROM dq_read_messages(NULL, %s, %s)', pg_temp.id_of('b'), pg_temp.id_of('d')),
    $$VALUES ('b'::text), ('c')$$,
    'from_id <= id < to_id'
);
SELECT results_eq(
    format('SELECT key FROM dq_read_messages(%L, %s, NULL)', 't_read', pg_temp.id_of('b')),
    $$VALUES ('b'::text), ('d')$$,
    'one queue, from an id on'
);
SELECT is(
    (SELECT count(*)::int FROM dq_read_messages(NULL, pg_temp.id_of('d') + 1, NULL)), 0, 'an empty range'
);
SELECT results_eq(
    $$SELECT id, queue, key, payload, state, scheduled_at, due_at, created_at, attempts, leased
      FROM dq_read_messages('t_read2', NULL, NULL)$$,
    $$SELECT pg_temp.id_of('c'), 't_read2'::text, 'c'::text, '3'::jsonb, NULL::jsonb,
             '2024-01-01 10:00:00+00'::timestamptz, '2024-01-01 10:01:00+00'::timestamptz,
             '2024-01-01 10:00:00+00'::timestamptz, 1, TRUE$$,
    'every column as stored; leased while the lease runs'
);
SELECT set_config('dq.now', '2024-01-01 10:02:00+00', TRUE);
SELECT is(
    (SELECT leased FROM dq_read_messages('t_read2', NULL, NULL)), FALSE,
    'leased follows dq_now(): the lease ran out at 10:01'
);

-- dead letters
SELECT dq_dead_letter(lock_token, 'gave up') FROM dq_poll('t_read', '1 minute');
SELECT results_eq(
    $$SELECT id, queue, key, payload, state, scheduled_at, created_at, attempts, error, failed_at
      FROM dq_read_dead_letters(NULL, NULL, NULL)$$,
    $$SELECT pg_temp.id_of('a'), 't_read'::text, 'a'::text, '1'::jsonb, NULL::jsonb,
             '2024-01-01 10:00:00+00'::timestamptz, '2024-01-01 10:00:00+00'::timestamptz, 1,
             'gave up'::text, '2024-01-01 10:02:00+00'::timestamptz$$,
    'dead letters with every column'
);
SELECT results_eq(
    $$SELECT * FROM dq_read_bounds('dead_letters', NULL)$$,
    $$SELECT pg_temp.id_of('a'), pg_temp.id_of('a')$$,
    'bounds of the dead letters'
);
SELECT is(
    (SELECT count(*)::int FROM dq_read_dead_letters('t_read2', NULL, NULL)), 0, 'another queue has none'
);
SELECT is(
    (SELECT count(*)::int FROM dq_read_dead_letters('t_read', NULL, pg_temp.id_of('a'))), 0,
    'to_id is exclusive'
);

-- read only
SELECT is(
    (
        SELECT array_agg(p.provolatile::text ORDER BY p.proname) FROM pg_proc AS p
        WHERE p.proname IN ('dq_read_messages', 'dq_read_dead_letters', 'dq_read_bounds')
    ),
    ARRAY['s', 's', 's'], 'all three are STABLE: no locks, no writes'
);

-- bad input
SELECT throws_ok(
    $$SELECT * FROM dq_read_bounds('queues', NULL)$$, '22023',
    'pgdq: source must be one of ''messages'', ''dead_letters'', got ''queues''', 'an unknown source: 22023'
);
SELECT throws_ok(
    $$SELECT * FROM dq_read_bounds(NULL, NULL)$$, '22004', 'pgdq: source must not be NULL', 'source NULL: 22004'
);
SELECT throws_ok(
    $$SELECT * FROM dq_read_messages('', NULL, NULL)$$, '22023', 'pgdq: queue must be 1 to 100 characters long, got 0',
    'a bad queue name: 22023'
);
SELECT throws_ok(
    $$SELECT * FROM dq_read_dead_letters(repeat('q', 101), NULL, NULL)$$, '22023', NULL,
    'a bad queue name for dead letters: 22023'
);
SELECT set_config('dq.now', 'infinity', TRUE);
SELECT throws_ok(
    $$SELECT * FROM dq_read_bounds('messages', NULL)$$, '22023', NULL, 'an invalid dq.now fails them'
);

SELECT * FROM finish();
ROLLBACK;
