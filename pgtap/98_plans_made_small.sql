-- A session keeps the generic plans of the hot functions until the table's
-- statistics change: plans made while the queue held one message, where a
-- scan of the one page was cheaper than an index, must still go by the
-- indexes once it holds 100,000 (before 1.2, every ack and lease of such a
-- session read the whole table until the first autovacuum).
BEGIN;
SELECT plan(1);

-- Nothing but the calls below may change what they read: no autovacuum or
-- ANALYZE of the table mid-test (its new statistics replan the session's
-- plans; the lock keeps them off until ROLLBACK), and the writers' random
-- folds (12_counts.sql) drawn from a fixed seed, the same every run.
LOCK TABLE dq_messages IN SHARE UPDATE EXCLUSIVE MODE;
SELECT setseed(0.5);

-- shared blocks (hit + read) touched by one call, nested statements included
CREATE FUNCTION pg_temp.blocks(query text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE plan json;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || query INTO plan;
    RETURN (plan -> 0 -> 'Plan' ->> 'Shared Hit Blocks')::int + (plan -> 0 -> 'Plan' ->> 'Shared Read Blocks')::int;
END $$;

-- a queue of this run's own (a run rolled back earlier leaves dead index
-- entries under its name, which a poll steps over until vacuum)
SELECT set_config('t.q', 't_grow_' || txid_current(), TRUE);
-- the plans, made while the table holds one message (five calls and more:
-- plpgsql keeps a generic plan from then on)
SELECT dq_send(current_setting('t.q'), '1');
SELECT dq_ack_many(array(SELECT d.lock_token FROM dq_poll_many(current_setting('t.q'), 10) AS d)) FROM generate_series(1, 6);
SELECT dq_ack(d.lock_token) FROM generate_series(1, 6), dq_poll(current_setting('t.q')) AS d;
SELECT count(*) FROM dq_send_many(current_setting('t.q'), array(SELECT '1'::jsonb FROM generate_series(1, 100000)));

SELECT cmp_ok(
    pg_temp.blocks($$SELECT dq_ack(d.lock_token) FROM dq_poll(current_setting('t.q')) AS d$$), '<=', 100,
    'a poll and an ack of one of 100,000 messages, planned at one, read a handful of pages'
);
SELECT * FROM finish();
ROLLBACK;
