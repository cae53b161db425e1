-- The poll path at depth: polls and dq_next_due read a handful of pages
-- with 100,000 future messages in the queue and 100,000 due ones in another
-- queue, and keep their index plans after thousands of calls (plpgsql may
-- switch to generic plans after five).
BEGIN;
SELECT plan(34);
SELECT set_config('dq.now', '2024-01-01 10:00:00+00', TRUE);

INSERT INTO dq_messages (queue, key, payload, scheduled_at, due_at, created_at)
SELECT
    't_deep' AS queue,
    'f' || g.t AS key,
    '{}' AS payload,
    g.t AS scheduled_at,
    g.t AS due_at,
    g.t AS created_at
FROM generate_series(
    '2024-01-02 00:00:01+00'::timestamptz, '2024-01-03 03:46:40+00', interval '1 second'
) AS g (t);
INSERT INTO dq_messages (queue, key, payload, scheduled_at, due_at, created_at)
SELECT
    't_deep_other' AS queue,
    'o' || g.t AS key,
    '{}' AS payload,
    g.t AS scheduled_at,
    g.t AS due_at,
    g.t AS created_at
FROM generate_series(
    '2024-01-01 00:00:00.1+00'::timestamptz, '2024-01-01 02:46:40+00', interval '100 ms'
) AS g (t);
ANALYZE dq_messages;

-- shared blocks (hit + read) touched by one call, nested statements
-- included: the fewer of two calls in a row, so that a one-off replan
-- (catalog reads after an invalidation another session's DDL sent, as once
-- on a busy CI machine: 895 blocks, then 4) is not taken for the plan's
-- cost; a plan that reads the table reads it both times
CREATE FUNCTION pg_temp.blocks(query text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE plan json;
DECLARE fewest int;
BEGIN
    FOR i IN 1..2 LOOP
        EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || query INTO plan;
        fewest := least(
            fewest,
            (plan -> 0 -> 'Plan' ->> 'Shared Hit Blocks')::int + (plan -> 0 -> 'Plan' ->> 'Shared Read Blocks')::int
        );
    END LOOP;
    RETURN fewest;
END $$;

-- warm up: the first call in a session also reads the catalogs
SELECT pg_temp.blocks($$SELECT * FROM dq_poll('t_warm')$$) + pg_temp.blocks($$SELECT dq_next_due('t_warm')$$) AS warm_up;
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_poll('t_deep')$$), '<=', 12,
    'dq_poll with 100,000 future messages and none due reads a handful of pages'
);
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_poll_many('t_deep', 100)$$), '<=', 12,
    'dq_poll_many(100) likewise'
);
SELECT cmp_ok(pg_temp.blocks($$SELECT dq_next_due('t_deep')$$), '<=', 12, 'dq_next_due likewise');
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_poll_many('t_empty_queue', 100)$$), '<=', 12,
    'a poll of an empty queue beside 200,000 messages likewise'
);

-- thousands of calls: every plan, custom or generic, stays on the indexes
CREATE TEMP TABLE scans_before AS
SELECT seq_scan FROM pg_stat_xact_user_tables
WHERE relid = 'dq_messages'::regclass;
DO $$
BEGIN
    FOR i IN 1..2000 LOOP
        PERFORM * FROM dq_poll('t_deep', '1 minute');
        PERFORM * FROM dq_poll_many('t_deep', 10, '1 minute');
        PERFORM dq_next_due('t_deep');
    END LOOP;
    FOR i IN 1..300 LOOP   -- some due work too: lease, then ack or nack
        PERFORM dq_ack(d.lock_token) FROM dq_poll_many('t_deep_other', 5, '1 minute') AS d;
        PERFORM dq_nack(d.lock_token, '2024-01-05') FROM dq_poll('t_deep_other', '1 minute') AS d;
        PERFORM dq_extend(d.lock_token, '1 hour') FROM dq_poll('t_deep_other', '1 minute') AS d;
    END LOOP;
END $$;
SELECT is(
    (
        SELECT seq_scan FROM pg_stat_xact_user_tables
        WHERE relid = 'dq_messages'::regclass
    ),
    (SELECT seq_scan FROM scans_before),
    'no sequential scan of dq_messages in 8,400 polls, acks, nacks and extends'
);
SELECT cmp_ok(pg_temp.blocks($$SELECT * FROM dq_poll('t_deep')$$), '<=', 12, 'dq_poll still reads a handful of pages');
SELECT cmp_ok(pg_temp.blocks($$SELECT * FROM dq_poll_many('t_deep', 100)$$), '<=', 12, 'dq_poll_many still does');
SELECT cmp_ok(pg_temp.blocks($$SELECT dq_next_due('t_deep')$$), '<=', 12, 'dq_next_due still does');
SELECT is((SELECT count(*)::int FROM dq_poll_many('t_deep_other', 10)), 10, 'due messages are still found');

-- the overviews read index ranges, never the whole table: a dashboard's
-- chart costs the messages of its hours, a key's queues a probe per queue
SELECT pg_temp.blocks($$SELECT * FROM dq_due_hours('t_warm', 1)$$) AS warm_up;
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_due_hours('t_deep', 1)$$), '<=', 12,
    'dq_due_hours with none of 100,000 messages in its hour reads a handful of pages'
);
CREATE TEMP TABLE overview_scans_before AS
SELECT seq_scan FROM pg_stat_xact_user_tables
WHERE relid = 'dq_messages'::regclass;
SELECT is((SELECT sum(due)::int FROM dq_due_hours('t_deep', 24)), 35999, 'dq_due_hours counts 24 hours of t_deep');
SELECT is(
    (SELECT array_agg(q) FROM dq_key_queues('f2024-01-02 00:00:01+00') AS q), ARRAY['t_deep'],
    'dq_key_queues finds the key''s queue'
);
SELECT is(
    (
        SELECT seq_scan FROM pg_stat_xact_user_tables
        WHERE relid = 'dq_messages'::regclass
    ),
    (SELECT seq_scan FROM overview_scans_before),
    'and neither scans dq_messages sequentially'
);

-- the hot-path helpers inline into the statements that call them: one that
-- does not (say, IMMUTABLE over a STABLE operator) costs microseconds a call
CREATE FUNCTION pg_temp.plan_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    line text;
    plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN VERBOSE ' || query LOOP
        plan := plan || line;
    END LOOP;
    RETURN plan;
END $$;
SELECT
    unalike(
        pg_temp.plan_of(
            format(
                $$SELECT %s FROM (SELECT 'k'::text, interval '1 min', now(), 1::bigint, gen_random_uuid(), '1'::jsonb, 0 OFFSET 0)$$
                || ' AS a (t, l, n, i, u, j, p)',
                h.expr
            )
        ),
        '%' || h.helper || '(%',
        h.helper || ' inlines into its caller'
    )
FROM (
    VALUES
    ('dq_now', 'dq_now()'),
    ('dq__valid_name', 'dq__valid_name(a.t, 100)'),
    ('dq__valid_lease', 'dq__valid_lease(a.l, a.n)'),
    ('dq__token', 'dq__token(a.i, ''\x0102030405060708''::bytea)'),
    ('dq__token_id', 'dq__token_id(a.u)'),
    ('dq__same_offer', 'dq__same_offer(a.j, a.n, a.t, a.p, a.j, a.n, a.t, a.p)'),
    ('dq__valid_queue', 'dq__valid_queue(a.t)'),
    ('dq__valid_key', 'dq__valid_key(a.t)'),
    ('dq__is_leased', 'dq__is_leased(a.u, a.n, a.n)'),
    ('dq__in_poll_indexes', 'dq__in_poll_indexes(a.t, a.p)')
) AS h (helper, expr);

-- snapshot reads and browsing at depth: each reads no more than the same
-- query on the index would (the bounds of every queue: the two ends of an
-- index on id), and a peek a handful of pages
INSERT INTO dq_dead_letters (queue, key, id, payload, scheduled_at, created_at, attempts, failed_at)
SELECT
    't_deep_dead' AS queue,
    'k' || g.i AS key,
    g.i AS id,
    '{}' AS payload,
    '2024-01-01' AS scheduled_at,
    '2024-01-01' AS created_at,
    1 AS attempts,
    '2024-01-01' AS failed_at
FROM generate_series(1, 50000) AS g (i);
ANALYZE dq_dead_letters;
CREATE TEMP TABLE some_ids AS
SELECT
    min(m.id) + 1000 AS from_id,
    min(m.id) + 1100 AS to_id
FROM dq_messages AS m;
SELECT  -- warm up: the first call plans each statement, reading the catalogs
    pg_temp.blocks($$SELECT * FROM dq_read_bounds('messages', NULL)$$)
    + pg_temp.blocks($$SELECT * FROM dq_read_bounds('dead_letters', NULL)$$)
    + pg_temp.blocks($$SELECT * FROM dq_read_dead_letters(NULL, 1000, 1100)$$)
    + pg_temp.blocks($$SELECT * FROM dq_read_messages(NULL, 1, 2)$$)
    + pg_temp.blocks($$SELECT * FROM dq_peek('t_deep', NULL, 100)$$) AS warm_up;
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_read_bounds('messages', NULL)$$), '<=',
    pg_temp.blocks($$SELECT min(m.id), max(m.id) FROM dq_messages AS m$$) + 2,
    'dq_read_bounds of every queue''s 200,000 messages reads the two ends of the primary key'
);
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_read_bounds('dead_letters', NULL)$$), '<=',
    pg_temp.blocks($$SELECT min(d.id), max(d.id) FROM dq_dead_letters AS d$$) + 2,
    'and of 50,000 dead letters, of dq_dead_letters_id'
);
SELECT cmp_ok(
    pg_temp.blocks($$SELECT min(d.id), max(d.id) FROM dq_dead_letters AS d$$), '<=', 12,
    'which is a handful of pages'
);
SELECT
    cmp_ok(
        pg_temp.blocks(format('SELECT * FROM dq_read_messages(NULL, %s, %s)', s.from_id, s.to_id)), '<=',
        pg_temp.blocks(format('SELECT * FROM dq_messages AS m WHERE m.id >= %s AND m.id < %s ORDER BY m.id', s.from_id, s.to_id))
        + 5,
        'dq_read_messages of 100 ids reads them by the primary key'
    )
FROM some_ids AS s;
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_read_dead_letters(NULL, 1000, 1100)$$), '<=',
    pg_temp.blocks($$SELECT * FROM dq_dead_letters AS d WHERE d.id >= 1000 AND d.id < 1100 ORDER BY d.id$$) + 5,
    'dq_read_dead_letters of 100 ids, by dq_dead_letters_id'
);
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_peek('t_deep', NULL, 100)$$), '<=', 12,
    'dq_peek of 100 of 100,000 messages reads a handful of pages'
);

-- a queue's stats cost what it holds (1.2): a small queue beside 200,000
-- messages reads a handful of pages, whatever its plan's estimates say
SELECT dq_offer('t_small', 'one', '1');
SELECT pg_temp.blocks($$SELECT * FROM dq_stats('t_warm')$$) + pg_temp.blocks($$SELECT * FROM dq_dead_stats('t_warm')$$) AS warm_up;
SELECT cmp_ok(
    -- (and a probe of dq_queues: paused, 1.2)
    pg_temp.blocks($$SELECT * FROM dq_stats('t_small')$$), '<=', 14,
    'dq_stats of a 1-message queue beside 200,000 messages reads a handful of pages'
);
SELECT is(
    (SELECT row(s.queue, s.ready, s.delayed, s.leased)::text FROM dq_stats('t_small') AS s),
    row('t_small', 1, 0, 0)::text,
    'and counts it'
);
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_dead_stats('t_small')$$), '<=', 12,
    'dq_dead_stats of one queue likewise'
);
SELECT pg_temp.blocks($$SELECT * FROM dq_read_bounds('messages', 't_warm')$$) AS warm_up;
SELECT cmp_ok(
    pg_temp.blocks($$SELECT * FROM dq_read_bounds('messages', 't_small')$$), '<=', 20,
    'dq_read_bounds of a 1-message queue likewise (keyless messages are in no index of every message)'
);
-- warm up: the count trigger plans its history statement (57_history.sql)
SELECT pg_temp.blocks($$SELECT dq_purge('t_nothing')$$) AS warm_up;
SELECT cmp_ok(
    pg_temp.blocks($$SELECT dq_purge('t_small')$$), '<=', 30,
    'dq_purge of a 1-message queue likewise'
);

SELECT * FROM finish();
ROLLBACK;
