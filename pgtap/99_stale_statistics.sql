-- A large queue added after the tables were last analyzed empty: the planner
-- then expects one row wherever it looks. No function that joins a batch
-- back to a table may plan a join that compares every pair of rows (dq_purge
-- did: minutes for 100,000). Each call below handles 50,000 rows; the linear
-- plans take well under a second each, a quadratic one far over the timeout.
-- Runs last: ANALYZE's statistics are written in place, kept after ROLLBACK.
BEGIN;
SELECT plan(12);

SELECT dq_offer('stale', 'gone', '1');  -- a page of nothing but a dead row
SELECT dq_configure('stale_dead', 1);
DELETE FROM dq_messages;
ANALYZE dq_messages;  -- reltuples 0 on relpages >= 1: "empty"
ANALYZE dq_dead_letters;
ANALYZE dq_groups;
SET LOCAL statement_timeout = '20s';

CREATE TEMP TABLE batch AS
SELECT
    array_agg('k' || g ORDER BY g) AS keys,
    array_agg(to_jsonb(g) ORDER BY g) AS payloads,
    array_agg(CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END ORDER BY g) AS channels
FROM generate_series(1, 50000) AS g;

-- keyed offers: the first write of new keys, then every key again (replayed)
SELECT is(
    (SELECT count(*)::int FROM batch AS b, dq_offer_many('stale', b.keys, b.payloads)), 50000,
    'dq_offer_many of 50,000 new keys'
);
SELECT is(
    (
        SELECT count(*)::int FROM batch AS b,
            dq_offer_many('stale', b.keys, array(SELECT p || '0' FROM unnest(b.payloads) AS p)) AS o
        WHERE o.outcome = 'updated'
    ),
    50000,
    'dq_offer_many updating 50,000 existing keys'
);
-- leased and acked as one batch
CREATE TEMP TABLE leased AS SELECT lock_token FROM dq_poll_many('stale', 50000, '1 hour');
SELECT is((SELECT count(*)::int FROM leased), 50000, 'dq_poll_many leasing 50,000');
SELECT is(dq_ack_many(array(SELECT lock_token FROM leased), 'stale'), 50000, 'dq_ack_many of 50,000 tokens');

-- keyless sends, leased and purged
SELECT is(
    (SELECT count(*)::int FROM batch AS b, dq_send_many('stale', b.payloads)), 50000,
    'dq_send_many of 50,000'
);
SELECT is(dq_purge('stale'), 50000::bigint, 'dq_purge of 50,000 messages');

-- the grouped poll, over two channels
SELECT is(
    (SELECT count(*)::int FROM batch AS b, dq_send_many('stale_groups', b.payloads, NULL, b.channels)), 50000,
    'dq_send_many of 50,000 in two channels'
);
SELECT is((SELECT count(*)::int FROM dq_poll_many('stale_groups', 50000)), 50000, 'the grouped poll leasing 50,000');

-- dead letters: buried by a poll, redriven, purged
SELECT count(*) FROM batch AS b, dq_offer_many('stale_dead', b.keys, b.payloads);
SELECT count(*) FROM dq_send_many('stale_dead', (SELECT b.payloads FROM batch AS b));
SELECT count(*) FROM dq_poll_many('stale_dead', 100000, '1 second');
SELECT set_config('dq.now', (now() + interval '1 minute')::text, TRUE);
SELECT is((SELECT count(*)::int FROM dq_poll_many('stale_dead', 100000)), 0, 'a poll burying 100,000 messages');
SELECT is(dq_dead_redrive('stale_dead'), 100000, 'dq_dead_redrive of 50,000 keyed and 50,000 keyless dead letters');
SELECT count(*) FROM dq_poll_many('stale_dead', 100000, '1 second');
SELECT set_config('dq.now', (now() + interval '2 minutes')::text, TRUE);
SELECT count(*) FROM dq_poll_many('stale_dead', 100000);
SELECT is(dq_dead_purge('stale_dead'), 100000::bigint, 'dq_dead_purge of 100,000 dead letters');
SELECT is(
    (SELECT dead FROM dq_dead_stats('stale_dead')), NULL, 'none left'
);

SELECT * FROM finish();
ROLLBACK;
