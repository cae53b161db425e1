-- The poll path at depth: polls and dq_next_due read a handful of pages
-- with 100,000 future messages in the queue and 100,000 due ones in another
-- queue, and keep their index plans after thousands of calls (plpgsql may
-- switch to generic plans after five).
BEGIN;
SELECT plan(15);
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

-- shared blocks (hit + read) touched by one call, nested statements included
CREATE FUNCTION pg_temp.blocks(query text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE plan json;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || query INTO plan;
    RETURN (plan -> 0 -> 'Plan' ->> 'Shared Hit Blocks')::int + (plan -> 0 -> 'Plan' ->> 'Shared Read Blocks')::int;
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
                $$SELECT %s FROM (SELECT 'k'::text, interval '1 min', now(), 1::bigint, gen_random_uuid(), '1'::jsonb OFFSET 0)$$
                || ' AS a (t, l, n, i, u, j)',
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
    ('dq__token', 'dq__token(a.i)'),
    ('dq__token_id', 'dq__token_id(a.u)'),
    ('dq__same_offer', 'dq__same_offer(a.j, a.n, a.j, a.n)')
) AS h (helper, expr);

SELECT * FROM finish();
ROLLBACK;
