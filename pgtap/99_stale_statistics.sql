-- A large queue added after the table was last analyzed empty: the planner
-- then expects one row wherever it looks. Deleting the queue must not plan a
-- join that compares every pair of rows (dq_purge did: minutes for 100,000).
-- Runs last: ANALYZE's statistics are written in place, kept after ROLLBACK.
BEGIN;
SELECT plan(1);

SELECT dq_offer('stale', 'gone', '1');  -- a page of nothing but a dead row
DELETE FROM dq_messages;
ANALYZE dq_messages;  -- reltuples 0 on relpages >= 1: "empty"
SELECT count(*) FROM dq_offer_many(
    'stale',
    array(SELECT 'k' || g FROM generate_series(1, 50000) AS g),
    array(SELECT '1'::jsonb FROM generate_series(1, 50000))
);
SET LOCAL statement_timeout = '10s';  -- the linear plan takes well under a second
SELECT is(dq_purge('stale'), 50000::bigint, 'dq_purge of 50,000 messages under stale statistics, in linear time');

SELECT * FROM finish();
ROLLBACK;
