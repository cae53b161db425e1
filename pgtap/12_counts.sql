-- The counts behind dq_stats()'s overview (1.2, sql/src/12_counts.sql): after
-- every kind of write they equal a count of the messages themselves, at
-- several times around the current bin; folding keeps them equal; a clock
-- pinned before folded bins, a role without the right to read them and a
-- role under row-level security read the messages instead.
BEGIN;
SELECT plan(58);

-- This file alters dq_messages (row-level security, a trigger, TRUNCATE)
-- after writing to it. Its strongest lock, taken before any write, keeps
-- autovacuum off both tables meanwhile: an autovacuum of dq_messages that
-- waited for this transaction deadlocked once with the ALTER TABLE below.
LOCK TABLE dq_messages, dq_counts IN ACCESS EXCLUSIVE MODE;

-- The counted overview equals the scanned one at now and at times around
-- the bins it sums (a bin is 10 minutes).
CREATE FUNCTION pg_temp.counts_agree() RETURNS boolean
LANGUAGE sql AS $$
    SELECT bool_and(
        array(SELECT row(c.*)::text FROM dq__counted_stats(t.at) AS c ORDER BY c.queue)
        = array(SELECT row(s.*)::text FROM dq__scanned_stats(t.at) AS s ORDER BY s.queue)
    )
    FROM (
        SELECT clock_timestamp() + o.offset_by AS at
        FROM unnest(ARRAY[
            interval '0', interval '-1 hour', interval '3 minutes', interval '9 minutes',
            interval '25 minutes', interval '2 hours', interval '3 days'
        ]) AS o (offset_by)
    ) AS t
$$;

SELECT ok(pg_temp.counts_agree(), 'no messages, no counts');

-- producing
SELECT dq_offer('t_counts', 'now', '1');
SELECT dq_offer('t_counts', 'later', '1', now() + interval '7 minutes');
SELECT dq_offer('t_counts', 'much later', '1', now() + interval '2 days');
SELECT ok(pg_temp.counts_agree(), 'dq_offer: created');
SELECT dq_offer('t_counts', 'later', '2', now() + interval '50 minutes');
SELECT ok(pg_temp.counts_agree(), 'dq_offer: updated to another bin');
SELECT dq_offer('t_counts', 'later', '3', now() + interval '51 minutes', FALSE);
SELECT ok(pg_temp.counts_agree(), 'dq_offer: ignored');
SELECT count(*) FROM dq_offer_many(
    't_counts',
    array(SELECT 'k' || g FROM generate_series(1, 300) AS g),
    array(SELECT '1'::jsonb FROM generate_series(1, 300)),
    array(SELECT now() + (g * 17 || ' seconds')::interval - interval '30 minutes' FROM generate_series(1, 300) AS g)
);
SELECT ok(pg_temp.counts_agree(), 'dq_offer_many: created over many bins');
SELECT count(*) FROM dq_offer_many(
    't_counts',
    array(SELECT 'k' || g FROM generate_series(1, 300, 2) AS g),
    array(SELECT '2'::jsonb FROM generate_series(1, 300, 2)),
    array(SELECT now() + (g * 5 || ' seconds')::interval FROM generate_series(1, 300, 2) AS g)
);
SELECT ok(pg_temp.counts_agree(), 'dq_offer_many: updated');
SELECT dq_send('t_counts_b', '1');
SELECT count(*) FROM dq_send_many(
    't_counts_b',
    array(SELECT '1'::jsonb FROM generate_series(1, 200)),
    array(SELECT now() + (g * 11 || ' seconds')::interval - interval '10 minutes' FROM generate_series(1, 200) AS g)
);
SELECT ok(pg_temp.counts_agree(), 'dq_send, dq_send_many');
SELECT dq_send('t_counts_c', '1', NULL, 'tenant-a', 0);
SELECT dq_send('t_counts_c', '1', now() + interval '4 minutes', 'tenant-b', 3);
SELECT dq_offer('t_counts_c', 'prio', '1', NULL, TRUE, NULL, 5);
SELECT ok(pg_temp.counts_agree(), 'messages with channels and priorities');

-- consuming
CREATE TEMP TABLE got AS SELECT * FROM dq_poll_many('t_counts', 40, '3 minutes');
-- the n-th lock token (by id) of queue that this test leased
CREATE FUNCTION pg_temp.token(queue text, n integer) RETURNS uuid
LANGUAGE sql AS $$
    SELECT g.lock_token FROM got AS g
    WHERE g.queue = token.queue
    ORDER BY g.id
    OFFSET n - 1 LIMIT 1
$$;

SELECT ok(pg_temp.counts_agree(), 'dq_poll_many: leases in the current bin');
INSERT INTO got SELECT * FROM dq_poll_many('t_counts_b', 30, '2 hours');
SELECT ok(pg_temp.counts_agree(), 'dq_poll_many: leases in a later bin');
INSERT INTO got SELECT * FROM dq_poll_many('t_counts_c', 3, '1 minute');
SELECT ok(pg_temp.counts_agree(), 'the grouped poll');
SELECT dq_ack(pg_temp.token('t_counts', 1));
SELECT ok(pg_temp.counts_agree(), 'dq_ack');
SELECT dq_ack_many(array(SELECT pg_temp.token('t_counts', g) FROM generate_series(2, 11) AS g));
SELECT ok(pg_temp.counts_agree(), 'dq_ack_many');
SELECT dq_nack(pg_temp.token('t_counts', 12), now() + interval '5 hours');
SELECT dq_nack(pg_temp.token('t_counts', 13));
SELECT ok(pg_temp.counts_agree(), 'dq_nack: later and now');
SELECT dq_extend(pg_temp.token('t_counts', 14), '1 day');
SELECT ok(pg_temp.counts_agree(), 'dq_extend');
SELECT dq_dead_letter(pg_temp.token('t_counts', 15), 'no');
SELECT ok(pg_temp.counts_agree(), 'dq_dead_letter');
SELECT count(*) FROM dq_ack_poll(
    array(SELECT pg_temp.token('t_counts', g) FROM generate_series(16, 20) AS g), 't_counts', 5
);
SELECT ok(pg_temp.counts_agree(), 'dq_ack_poll');
SELECT dq_configure('t_counts_b', 1);
SELECT dq_nack(g.lock_token) FROM got AS g
WHERE g.queue = 't_counts_b';
SELECT count(*) FROM dq_poll_many('t_counts_b', 500);
SELECT ok(pg_temp.counts_agree(), 'a poll that buries spent messages');
SELECT dq_dead_redrive('t_counts_b');
SELECT ok(pg_temp.counts_agree(), 'dq_dead_redrive');

-- managing
SELECT dq_cancel('t_counts', 'much later');
SELECT dq_cancel_id('t_counts_b', min(m.id)) FROM dq_messages AS m
WHERE m.queue = 't_counts_b';
SELECT ok(pg_temp.counts_agree(), 'dq_cancel, dq_cancel_id');
SELECT dq_cron_install(
    't_counts_d', 'tick', 'h1',
    array(SELECT now() + g * interval '1 hour' FROM generate_series(1, 5) AS g),
    array(SELECT '{}'::jsonb FROM generate_series(1, 5))
);
SELECT ok(pg_temp.counts_agree(), 'dq_cron_install');
SELECT dq_cron_uninstall('t_counts_d', 'tick');
SELECT ok(pg_temp.counts_agree(), 'dq_cron_uninstall');
SELECT dq_schedule_set('t_counts_d', 'every', '* * * * *');
SELECT set_config('dq.now', (now() + interval '3 minutes')::text, TRUE);
SELECT count(*) FROM dq_poll_many('t_counts_d', 1);
SELECT set_config('dq.now', '', TRUE);
SELECT ok(pg_temp.counts_agree(), 'a schedule''s occurrences');
SELECT dq_purge('t_counts_c');
SELECT ok(pg_temp.counts_agree(), 'dq_purge');
UPDATE dq_messages SET due_at = due_at + interval '1 hour'
WHERE queue = 't_counts_b';
SELECT ok(pg_temp.counts_agree(), 'any other statement on the table');
INSERT INTO dq_messages (queue, payload, scheduled_at, due_at, created_at, channel, priority)
VALUES
('t_counts_f', '1', now(), now() + interval '4 minutes', now(), 'c', 0),
('t_counts_f', '1', now(), now() - interval '4 minutes', now(), '', 3);
SELECT ok(pg_temp.counts_agree(), 'grouped messages of a queue without groups (written by hand)');
DELETE FROM dq_messages
WHERE queue = 't_counts_f';

-- The hot statements count their own rows and the triggers skip them
-- (1.3): but not the acks of a queue keeping history, whose trigger records
-- and counts them, nor writes nested in a counting statement (a user's
-- trigger), which the triggers count.
SELECT dq_retain('t_counts_h', '1 hour');
SELECT count(*) FROM dq_send_many('t_counts_h', array_fill('1'::jsonb, ARRAY[5]));
SELECT dq_ack(p.lock_token)
FROM dq_poll_many('t_counts_h', 1) AS p;
SELECT dq_ack_many(array(SELECT p.lock_token FROM dq_poll_many('t_counts_h', 2) AS p));
SELECT ok(pg_temp.counts_agree(), 'acks of a queue keeping history');
SELECT is(
    (
        SELECT count(*)::int FROM dq_history
        WHERE queue = 't_counts_h' AND outcome = 'acked'
    ),
    3,
    'and recorded'
);
CREATE FUNCTION pg_temp.copy_sent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN  -- not its own insert
        RETURN NULL;
    END IF;
    -- by schema: it runs under the search_path of pgdq's function
    INSERT INTO public.dq_messages (queue, payload, scheduled_at, due_at, created_at)
    SELECT 't_counts_g2', n.payload, n.scheduled_at, n.due_at + interval '1 day', n.created_at
    FROM sent AS n
    WHERE n.queue = 't_counts_g';
    RETURN NULL;
END
$$;
CREATE TRIGGER t_copy_sent AFTER INSERT ON dq_messages REFERENCING NEW TABLE AS sent
FOR EACH STATEMENT EXECUTE FUNCTION pg_temp.copy_sent();
SELECT dq_send('t_counts_g', '1');
SELECT count(*) FROM dq_send_many('t_counts_g', array_fill('1'::jsonb, ARRAY[3]));
SELECT is(
    (
        SELECT count(*)::int FROM dq_messages
        WHERE queue = 't_counts_g2'
    ),
    4,
    'a user''s trigger copied each message'
);
SELECT ok(pg_temp.counts_agree(), 'and its writes are counted');
DROP TRIGGER t_copy_sent ON dq_messages;
-- a user's BEFORE trigger that calls pgdq inside a counting statement: the
-- inner call puts the outer statement's mark back, so it counts once
CREATE FUNCTION pg_temp.audit_sent() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.queue = 't_counts_g' THEN
        PERFORM public.dq_send('t_counts_g2', NEW.payload);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER t_audit_sent BEFORE INSERT ON dq_messages
FOR EACH ROW EXECUTE FUNCTION pg_temp.audit_sent();
SELECT dq_send('t_counts_g', '1');
SELECT count(*) FROM dq_send_many('t_counts_g', array_fill('1'::jsonb, ARRAY[2]));
SELECT ok(pg_temp.counts_agree(), 'a user''s BEFORE trigger sending inside a send: counted once each');
DROP TRIGGER t_audit_sent ON dq_messages;
-- the marks are a stack (dq__counting_inline): each counting call pops its
-- own, leaving a mark it found (here one of depth 5, as a call nested in a
-- trigger would find its caller's) as it was, so that a direct write after
-- them in the same transaction is counted by the triggers
SELECT set_config('dq.counted', ',5', TRUE);
SELECT dq_send('t_counts_g', '1');
SELECT count(*) FROM dq_send_many('t_counts_g', array_fill('1'::jsonb, ARRAY[2]));
SELECT dq_offer('t_counts_g', 'marked', '1');
SELECT count(*) FROM dq_offer_many('t_counts_g', ARRAY['marked2'], ARRAY['1'::jsonb]);
SELECT dq_ack(p.lock_token) FROM dq_poll('t_counts_g') AS p;
SELECT dq_ack_many(array(SELECT p.lock_token FROM dq_poll_many('t_counts_g', 2) AS p));
SELECT is(current_setting('dq.counted'), ',5', 'every counting call pops its own mark, and only its own');
SELECT set_config('dq.counted', '', TRUE);
INSERT INTO dq_messages (queue, payload, scheduled_at, due_at, created_at)
VALUES ('t_counts_g', '1', now(), now(), now());
SELECT ok(pg_temp.counts_agree(), 'a direct insert after them is counted');
SELECT throws_ok(
    $$INSERT INTO dq_counts VALUES ('t_counts', now(), FALSE, 9223372036854775807)$$,
    '23514', NULL, 'a count row beyond 2^32 is refused (a fold of false rows cannot overflow)'
);
DELETE FROM dq_messages
WHERE queue IN ('t_counts_g', 't_counts_g2', 't_counts_h');

SELECT is(
    (SELECT array_agg(queue ORDER BY queue) FROM dq_stats()),
    ARRAY['t_counts', 't_counts_b', 't_counts_d'],
    'dq_stats() lists the queues with messages'
);
SELECT is(
    array(SELECT row(s.*)::text FROM dq_stats() AS s),
    array(SELECT row(s.*, FALSE)::text FROM dq__scanned_stats(dq_now()) AS s),
    'dq_stats() reads the counts'
);

-- folding
SELECT ok((SELECT count(*) FROM dq_counts) > 20, 'many delta rows before a fold');
SELECT dq__fold_counts();
SELECT ok(pg_temp.counts_agree(), 'folded, the counts agree');
SELECT is(
    (SELECT count(*)::int FROM dq_counts),
    (
        SELECT count(*)::int FROM (
            SELECT DISTINCT
                m.queue,
                dq__due_bin(m.due_at) AS due_bin,
                m.lock_token IS NOT NULL AS leased
            FROM dq_messages AS m
        ) AS d
    ),
    'one row per queue, bin and lease'
);
SELECT dq_send('t_counts_e', '1', now() - interval '10 days');
SELECT dq_send('t_counts_e', '1', now() - interval '8 days');
SELECT dq__fold_counts();
SELECT is(
    (
        SELECT array_agg(n) FROM dq_counts
        WHERE queue = 't_counts_e'
    ),
    ARRAY[2::bigint],
    'bins that ended over 7 days ago fold into one'
);
SELECT ok(pg_temp.counts_agree(), 'and the counts agree');
SELECT set_config('dq.now', (now() - interval '9 days')::text, TRUE);
SELECT is(
    (
        SELECT row(ready, delayed) FROM dq_stats()
        WHERE queue = 't_counts_e'
    ),
    row(1::bigint, 1::bigint),
    'a clock pinned before folded bins reads the messages'
);
SELECT set_config('dq.now', '', TRUE);

-- who reads the counts (at one pinned instant: dq_stats() and the
-- expected rows each read the clock, and a message falling due between the
-- two reads made them differ)
SELECT set_config('dq.now', clock_timestamp()::text, TRUE);
CREATE ROLE t_counts_reader;
GRANT SELECT ON dq_messages TO t_counts_reader;
SET LOCAL ROLE t_counts_reader;
SELECT is(
    array(SELECT row(s.*)::text FROM dq_stats() AS s),
    -- paused: NULL, unknown to a role that may not read dq_queues
    array(SELECT row(s.*, NULL::boolean)::text FROM dq__scanned_stats(dq_now()) AS s),
    'a role that may not read the counts reads the messages'
);
SELECT throws_ok(
    'SELECT count(*) FROM dq_counts', '42501', NULL, 'and cannot read the counts'
);
RESET ROLE;
GRANT SELECT ON dq_counts TO t_counts_reader;
SET LOCAL ROLE t_counts_reader;
SELECT is(
    array(SELECT row(s.*)::text FROM dq_stats() AS s),
    array(SELECT row(s.*, NULL::boolean)::text FROM dq__scanned_stats(dq_now()) AS s),
    'a role that may read the messages and the counts, and nothing else, reads the counts'
);
RESET ROLE;
ALTER TABLE dq_messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY t_counts_b_only ON dq_messages TO t_counts_reader USING (queue = 't_counts_b');
SET LOCAL ROLE t_counts_reader;
SELECT is(
    (SELECT array_agg(queue) FROM dq_stats()), ARRAY['t_counts_b'], 'a role under row-level security sees its queues'
);
SELECT is((SELECT count(*)::int FROM dq_counts), 0, 'and no count');
RESET ROLE;
GRANT INSERT ON dq_messages, dq_counts TO t_counts_reader;
SET LOCAL ROLE t_counts_reader;
SELECT lives_ok($$SELECT dq_send('t_counts_b', '1')$$, 'such a role sends (1.3: counted by the trigger)');
SELECT throws_ok(
    $$INSERT INTO dq_counts VALUES ('t_counts_b', now(), FALSE, -1)$$,
    '42501', NULL, 'and adds no count of its own'
);
RESET ROLE;
SELECT ok(pg_temp.counts_agree(), 'and the counts agree');
SELECT set_config('dq.now', '', TRUE);

-- writes by others
CREATE TEMP TABLE fake (queue text, due_at timestamptz, lock_token uuid);
SELECT throws_ok(
    'CREATE TRIGGER t_fake AFTER INSERT ON fake REFERENCING NEW TABLE AS changed_rows '
    'FOR EACH STATEMENT EXECUTE FUNCTION dq__count_rows(); '
    'INSERT INTO fake VALUES (''t_fake'', now(), NULL)',
    '42501', NULL, 'the count triggers count dq_messages only'
);
CREATE TRIGGER t_twice AFTER INSERT ON dq_messages REFERENCING NEW TABLE AS changed_rows
FOR EACH STATEMENT EXECUTE FUNCTION dq__count_rows();
SELECT throws_ok(
    $$SELECT dq_send('t_counts', '1')$$, '42501', NULL, 'and only through pgdq''s own triggers on it'
);
DROP TRIGGER t_twice ON dq_messages;
TRUNCATE dq_messages;
SELECT is((SELECT count(*)::int FROM dq_counts), 0, 'TRUNCATE clears the counts');
SELECT dq_send('t_counts', '1');
SELECT lives_ok('TRUNCATE dq_messages, dq_counts', 'TRUNCATE of both tables in one statement');
SELECT is((SELECT count(*)::int FROM dq_counts), 0, 'and no count is left');
SELECT dq_send('t_counts', '1');
SELECT lives_ok(
    $test$
    DO $do$
    DECLARE
        reading refcursor;
        seen record;
    BEGIN
        OPEN reading FOR SELECT * FROM dq_counts;
        FETCH reading INTO seen;
        TRUNCATE dq_messages;
        CLOSE reading;
    END
    $do$
    $test$,
    'TRUNCATE while a cursor reads the counts'
);
SELECT is((SELECT count(*)::int FROM dq_counts), 0, 'and no count is left either');

-- a fold runs under the writer's settings (enable_seqscan = off in the hot
-- functions), which price its scan of dq_counts high enough for JIT: 60-90 ms
-- of compiling a fold
SELECT ok(
    (
        SELECT 'jit=off' = any(p.proconfig) FROM pg_proc AS p
        WHERE p.oid = 'dq__fold_counts'::regproc
    ),
    'a fold is never compiled'
);

SELECT * FROM finish();
ROLLBACK;
