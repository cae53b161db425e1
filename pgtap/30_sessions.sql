-- Across sessions (through dblink): polls skip rows other sessions are
-- taking without waiting; dq_wakeup is sent at commit only when a written
-- message is due no later than the rest of its queue; a redrive never waits
-- for a poll burying the same key.
-- dblink is in contrib, which the PyPI build of PostgreSQL 16 that make test
-- runs (pgserver) leaves out: there the file says so and skips (the pytest
-- suites' cross-session tests run on every version).
SELECT NOT EXISTS (
    SELECT FROM pg_available_extensions
    WHERE name = 'dblink'
) AS no_dblink \gset
\if :no_dblink
SELECT '1..0 # SKIP no dblink on this server (a PostgreSQL build without contrib)';
\quit
\endif
BEGIN;
SET LOCAL statement_timeout = '60s';
-- a connection string for another session on this same server
CREATE FUNCTION pg_temp.here() RETURNS text LANGUAGE sql AS $$
    SELECT format(
        'dbname=%s port=%s user=%s host=%s', current_database(), current_setting('port'), current_user,
        coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), '127.0.0.1')
    )
$$;
CREATE EXTENSION IF NOT EXISTS dblink;
SELECT plan(37);
SELECT dblink_connect('producer', pg_temp.here());
SELECT dblink_connect('holder', pg_temp.here());
SELECT dblink_connect('listener', pg_temp.here());
SELECT dblink_connect('waiter', pg_temp.here());
-- run a one-column query in another session; its row count
CREATE FUNCTION pg_temp.remote(conn text, query text) RETURNS int LANGUAGE sql AS $$
    SELECT count(*)::int FROM dblink(conn, query) AS t (x text)
$$;

-- a poll never waits for, and never returns, rows another session is taking
SELECT pg_temp.remote('producer', $$SELECT dq_purge('t_sess') + dq_purge('t_sess2')$$);
SELECT
    pg_temp.remote(
        'producer', $$SELECT count(*) FROM dq_offer_many('t_sess', ARRAY['a', 'b', 'c', 'd'], ARRAY['1', '2', '3', '4']::jsonb[])$$
    );
SELECT dblink_exec('holder', 'BEGIN');
SELECT is(
    (SELECT array_agg(t.k ORDER BY t.k) FROM dblink('holder', $$SELECT key FROM dq_poll_many('t_sess', 2)$$) AS t (k text)),
    ARRAY['a', 'b'], 'another session leases a and b and keeps its transaction open'
);
SET LOCAL lock_timeout = '200ms';
SELECT results_eq(
    $$SELECT key FROM dq_poll_many('t_sess', 10)$$, $$VALUES ('c'), ('d')$$,
    'a poll skips the rows being taken, without waiting'
);
SELECT dblink_exec('holder', 'ROLLBACK');

-- concurrent offers of one key: one creates, the other waits, then updates
SELECT dblink_exec('holder', 'BEGIN');
SELECT is(
    (SELECT t.o FROM dblink('holder', $$SELECT dq_offer('t_sess', 'race', '1')$$) AS t (o text)),
    'created', 'one session creates a key and keeps its transaction open'
);
SELECT dblink_send_query('waiter', $$SELECT dq_offer('t_sess', 'race', '2')$$);
SELECT pg_sleep(0.3);
SELECT is(dblink_is_busy('waiter'), 1, 'a concurrent offer of the same key waits');
SELECT dblink_exec('holder', 'COMMIT');
SELECT is(
    (SELECT t.o FROM dblink_get_result('waiter') AS t (o text)), 'updated',
    'and then updates it: no unique violation'
);
-- an empty result ends the async query
SELECT count(*) AS done FROM dblink_get_result('waiter') AS t (o text);  -- noqa: AL05

-- batches in opposite key orders never deadlock: locks are taken in key order
SELECT dblink_exec('holder', 'SET lock_timeout = ''3s''');
SELECT dblink_exec('holder', 'BEGIN');
SELECT
    pg_temp.remote(
        'holder', $$SELECT count(*) FROM dq_offer_many('t_sess', ARRAY['x'], ARRAY['1']::jsonb[])$$
    );
SELECT dblink_send_query('waiter', $$SELECT outcome FROM dq_offer_many('t_sess', ARRAY['y', 'x'], ARRAY['2', '2']::jsonb[])$$);
SELECT pg_sleep(0.3);
SELECT is(dblink_is_busy('waiter'), 1, 'a batch [y, x] waits for x, held by another batch');
SELECT lives_ok(
    $$SELECT pg_temp.remote('holder', 'SELECT count(*) FROM dq_offer_many(''t_sess'', ARRAY[''y''], ARRAY[''1'']::jsonb[])')$$,
    'the holder can still take y: the waiting batch did not lock y before x'
);
SELECT dblink_exec('holder', 'COMMIT');
SELECT results_eq(
    $$SELECT t.o FROM dblink_get_result('waiter') AS t (o text)$$, $$VALUES ('updated'), ('updated')$$,
    'the waiting batch then completes, in input order'
);
SELECT count(*) AS done FROM dblink_get_result('waiter') AS t (o text);  -- noqa: AL05

-- wake-ups (api-v1.1): a statement notifies, at commit, only when a message
-- it wrote is due no later than every other message of its queue it can see
SELECT dblink_exec('listener', 'LISTEN dq_wakeup');
SELECT pg_temp.remote('producer', $$SELECT dq_purge('t_wake') + dq_purge('t_wake2') + dq_dead_purge('t_wake')$$);
-- what the listener hears after the producer runs query (empty: nothing)
CREATE FUNCTION pg_temp.wakes(query text) RETURNS text[] LANGUAGE sql AS $$
    SELECT pg_temp.remote('producer', query);
    SELECT pg_sleep(0.2);
    SELECT coalesce(array_agg(t.notify_name || ':' || t.extra ORDER BY t.extra), '{}')
    FROM dblink_get_notify('listener') AS t;
$$;
-- a timestamptz literal, minutes from now
CREATE FUNCTION pg_temp.at(minutes int) RETURNS text LANGUAGE sql AS $$
    SELECT quote_literal(clock_timestamp() + make_interval(mins => minutes)) || '::timestamptz'
$$;

SELECT is(
    pg_temp.wakes($$SELECT dq_offer('t_wake', 'a', '1', $$ || pg_temp.at(60) || ')'),
    ARRAY['dq_wakeup:t_wake'], 'an offer into an empty queue notifies dq_wakeup, payload the queue'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_offer('t_wake', 'b', '1', $$ || pg_temp.at(120) || ')'),
    '{}', 'an offer behind the head sends nothing'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_offer('t_wake', 'c', '1', $$ || pg_temp.at(30) || ')'),
    ARRAY['dq_wakeup:t_wake'], 'an offer earlier than the head notifies'
);
SELECT is(pg_temp.wakes($$SELECT dq_offer('t_wake', 'c', '1')$$), '{}', 'an ignored offer sends nothing');
SELECT is(
    pg_temp.wakes($$SELECT dq_offer('t_wake', 'b', '2', $$ || pg_temp.at(10) || ')'),
    ARRAY['dq_wakeup:t_wake'], 'an update that makes its message the head notifies'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_offer('t_wake', 'a', '2', $$ || pg_temp.at(90) || ')'),
    '{}', 'an update behind the head sends nothing'
);
SELECT is(
    pg_temp.wakes(
        $$SELECT count(*) FROM dq_offer_many('t_wake', ARRAY['d', 'e'], ARRAY['1', '2']::jsonb[], ARRAY[$$
        || pg_temp.at(200) || ', ' || pg_temp.at(300) || '])'
    ),
    '{}', 'a batch entirely behind the head sends nothing'
);
SELECT is(
    pg_temp.wakes(
        $$SELECT count(*) FROM dq_offer_many('t_wake', ARRAY['f', 'g', 'h'], ARRAY['1', '2', '3']::jsonb[], ARRAY[$$
        || pg_temp.at(400) || ', ' || pg_temp.at(1) || ', ' || pg_temp.at(2) || '])'
    ),
    ARRAY['dq_wakeup:t_wake'], 'a batch with one message before the head sends exactly one'
);
SELECT is(
    pg_temp.wakes($$SELECT count(*) FROM dq_offer_many('t_wake', ARRAY['f', 'g'], ARRAY['1', '2']::jsonb[], NULL, FALSE)$$),
    '{}', 'a batch that only ignores sends nothing'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_cron_install('t_wake', 'cr', 'h', ARRAY['2999-01-01 00:00:00+00'::timestamptz], ARRAY['1']::jsonb[])$$),
    '{}', 'a cron install behind the head sends nothing'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_cron_install('t_wake2', 'cr', 'h', ARRAY['2999-01-01 00:00:00+00'::timestamptz], ARRAY['1']::jsonb[])$$),
    ARRAY['dq_wakeup:t_wake2'], 'a cron install into an empty queue notifies'
);

-- nacks: 'now' is the only due message; each statement leases it and hands it back
SELECT is(pg_temp.wakes($$SELECT dq_offer('t_wake', 'now', '1')$$), ARRAY['dq_wakeup:t_wake'], 'a message due now notifies');
SELECT is(pg_temp.wakes($$SELECT count(*) FROM dq_poll('t_wake', '1 second')$$), '{}', 'a poll sends nothing');
SELECT pg_sleep(1);
SELECT is(
    pg_temp.wakes($$SELECT dq_nack(lock_token) FROM dq_poll('t_wake', '1 hour')$$),
    ARRAY['dq_wakeup:t_wake'], 'a nack for now while every other message is delayed notifies'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_nack(lock_token, $$ || pg_temp.at(500) || $$) FROM dq_poll('t_wake', '1 hour')$$),
    '{}', 'a nack behind the head (another message is due sooner) sends nothing'
);

-- transactions: at commit, at most one per queue; none after a rollback
SELECT dblink_exec('producer', 'BEGIN');
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_wake', 'tx1', '1', '2000-01-01')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_wake', 'tx2', '1', '1999-01-01')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_wake2', 'tx3', '1', '2000-01-01')$$);
SELECT pg_sleep(0.2);
SELECT is((SELECT count(*)::int FROM dblink_get_notify('listener')), 0, 'nothing is sent before commit');
SELECT is(
    pg_temp.wakes('COMMIT'), ARRAY['dq_wakeup:t_wake', 'dq_wakeup:t_wake2'],
    'at commit, one notification per queue whose head moved'
);
SELECT dblink_exec('producer', 'BEGIN');
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_wake', 'rb', '1', '1990-01-01')$$);
SELECT is(pg_temp.wakes('ROLLBACK'), '{}', 'a rolled-back offer sends nothing');
SELECT is(
    (SELECT count(*)::int FROM dblink('producer', $$SELECT key FROM dq_get('t_wake', 'rb')$$) AS t (k text)), 0,  -- noqa: AL05
    'and leaves no message'
);

-- redrives: tx2 and tx1 (due in the past) are buried, then offered again
SELECT pg_temp.remote('producer', $$SELECT dq_dead_letter(lock_token) FROM dq_poll_many('t_wake', 2, '1 hour')$$);
SELECT is(
    pg_temp.wakes($$SELECT dq_dead_redrive('t_wake', 'tx1', $$ || pg_temp.at(700) || ')'),
    '{}', 'a redrive behind the head sends nothing'
);
SELECT is(
    pg_temp.wakes($$SELECT dq_dead_redrive('t_wake', 'tx2', '1980-01-01')$$),
    ARRAY['dq_wakeup:t_wake'], 'a redrive that becomes the head notifies'
);

-- a redrive never waits for a poll that is burying the same key (no deadlock)
SELECT pg_temp.remote('producer', $$SELECT dq_dead_purge('t_dr') + dq_purge('t_dr')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_dr', 'k', '1')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_dead_letter(lock_token, 'first') FROM dq_poll('t_dr')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_dr', 'k', '2')$$);  -- live again
SELECT dblink_exec('holder', 'BEGIN');
SELECT pg_temp.remote('holder', $$SELECT dq_dead_letter(lock_token, 'second') FROM dq_poll('t_dr')$$);
SET LOCAL lock_timeout = '200ms';
SELECT is(dq_dead_redrive('t_dr', 'k'), 0, 'the key is live for this session: left alone, without waiting');
SELECT dblink_exec('holder', 'COMMIT');
SELECT is(
    (SELECT error FROM dq_dead_list('t_dr')), 'second', 'the bury went through and replaced the dead letter'
);
SELECT pg_temp.remote('producer', $$SELECT dq_dead_purge('t_dr')$$);

-- a transaction's first write inserts a batch of new keys in one try; a
-- batch whose existing key sorts between new ones (here m) is undone and
-- replayed (the producer session commits each call: each is a first write)
SELECT pg_temp.remote('producer', $$SELECT dq_purge('t_mid')$$);
SELECT is(
    (SELECT t.o FROM dblink('producer', $$SELECT dq_offer('t_mid', 'm', '1')$$) AS t (o text)),
    'created', 'm exists'
);
SELECT results_eq(
    $$SELECT t.k, t.o FROM dblink(
        'producer',
        'SELECT key, outcome FROM dq_offer_many(''t_mid'', ARRAY[''z'', ''a'', ''m''], ARRAY[''1'', ''1'', ''2'']::jsonb[])'
    ) AS t (k text, o text)$$,
    $$VALUES ('z', 'created'), ('a', 'created'), ('m', 'updated')$$,
    'a batch with an existing key among new ones: each outcome as dq_offer gives it'
);
SELECT is(
    (
        SELECT array_agg(t.k ORDER BY t.k)
        FROM dblink('producer', $$SELECT key FROM dq_messages WHERE queue = 't_mid'$$) AS t (k text)
    ),
    ARRAY['a', 'm', 'z'],
    'one row per key: nothing left from the undone try'
);

-- an ack that waits for a concurrent extend of its delivery deletes the
-- message once the extend commits (it finds the row version it locked)
SELECT pg_temp.remote('producer', $$SELECT dq_purge('t_ackx')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_ackx', 'k', '1')$$);
CREATE TEMP TABLE ackx AS
SELECT t.token FROM dblink('producer', $$SELECT lock_token FROM dq_poll('t_ackx')$$) AS t (token uuid);
SELECT dblink_exec('holder', 'BEGIN');
SELECT pg_temp.remote('holder', format('SELECT dq_extend(%L, %L)', (SELECT token FROM ackx), '10 minutes'));
SELECT dblink_send_query('waiter', format('SELECT dq_ack_many(ARRAY[%L]::uuid[])', (SELECT token FROM ackx)));
SELECT pg_sleep(0.3);
SELECT is(dblink_is_busy('waiter'), 1, 'an ack of a delivery being extended waits');
SELECT dblink_exec('holder', 'COMMIT');
SELECT is((SELECT t.n FROM dblink_get_result('waiter') AS t (n int)), 1, 'then acks it');
SELECT count(*) AS done FROM dblink_get_result('waiter') AS t (n int);  -- noqa: AL05
SELECT is(
    pg_temp.remote('producer', $$SELECT key FROM dq_messages WHERE queue = 't_ackx'$$), 0,
    'and the message is gone'
);

SELECT dblink_disconnect('producer');
SELECT dblink_disconnect('holder');
SELECT dblink_disconnect('listener');
SELECT dblink_disconnect('waiter');
SELECT * FROM finish();
ROLLBACK;
-- the messages were committed by the other sessions: remove them
SELECT dq_purge('t_sess') + dq_purge('t_sess2') + dq_purge('t_wake') + dq_purge('t_wake2') AS removed;
SELECT dq_purge('t_mid') + dq_purge('t_ackx') AS removed;
