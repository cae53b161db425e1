-- Across sessions (through dblink): polls skip rows other sessions are
-- taking without waiting; dq_wakeup sends one notification per touched queue
-- per statement at commit, none for ignored offers.
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
SELECT plan(22);
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

-- wakeups
SELECT dblink_exec('listener', 'LISTEN dq_wakeup');
CREATE TEMP TABLE heard (n int, channel text, payload text);
CREATE FUNCTION pg_temp.hear(n int) RETURNS void LANGUAGE sql AS $$
    SELECT pg_sleep(0.3);
    INSERT INTO heard SELECT n, t.notify_name, t.extra FROM dblink_get_notify('listener') AS t;
$$;

SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_sess2', 'k1', '1')$$);
SELECT pg_temp.hear(1);
SELECT results_eq(
    $$SELECT channel, payload FROM heard WHERE n = 1$$, $$VALUES ('dq_wakeup', 't_sess2')$$,
    'a created offer sends one notification on dq_wakeup, payload the queue'
);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_sess2', 'k1', '1')$$);
SELECT pg_temp.hear(2);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE n = 2
), 0, 'an ignored offer sends none');
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_sess2', 'k1', '2')$$);
SELECT pg_temp.hear(3);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE n = 3
), 1, 'an updated offer sends one');
SELECT
    pg_temp.remote(
        'producer', $$SELECT count(*) FROM dq_offer_many('t_sess2', ARRAY['m1', 'm2', 'm3', 'k1'], ARRAY['1', '2', '3', '4']::jsonb[])$$
    );
SELECT pg_temp.hear(4);
SELECT results_eq($$SELECT payload FROM heard WHERE n = 4$$, $$VALUES ('t_sess2')$$, 'dq_offer_many sends exactly one per statement');
SELECT pg_temp.remote('producer', $$SELECT count(*) FROM dq_offer_many('t_sess2', ARRAY['m1', 'm2'], ARRAY['1', '2']::jsonb[])$$);
SELECT pg_temp.hear(5);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE n = 5
), 0, 'a batch that only ignores sends none');
SELECT
    pg_temp.remote(
        'producer', $$SELECT dq_cron_install('t_sess2', 'cr', 'h', ARRAY['2999-01-01 00:00:00+00'::timestamptz], ARRAY['1']::jsonb[])$$
    );
SELECT pg_temp.hear(6);
SELECT results_eq($$SELECT payload FROM heard WHERE n = 6$$, $$VALUES ('t_sess2')$$, 'dq_cron_install sends one');
SELECT
    pg_temp.remote(
        'producer', $$SELECT dq_cron_install('t_sess2', 'cr', 'h', ARRAY['2999-01-01 00:00:00+00'::timestamptz], ARRAY['1']::jsonb[])$$
    );
SELECT pg_temp.hear(7);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE n = 7
), 0, 'a cron install that creates nothing sends none');

SELECT dblink_exec('producer', 'BEGIN');
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_sess2', 'tx1', '1')$$);
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_sess', 'tx2', '1')$$);
SELECT pg_temp.hear(8);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE n = 8
), 0, 'nothing is sent before commit');
SELECT dblink_exec('producer', 'COMMIT');
SELECT pg_temp.hear(9);
SELECT results_eq(
    $$SELECT payload FROM heard WHERE n = 9 ORDER BY payload$$, $$VALUES ('t_sess'), ('t_sess2')$$,
    'at commit, one notification per queue touched'
);
SELECT dblink_exec('producer', 'BEGIN');
SELECT pg_temp.remote('producer', $$SELECT dq_offer('t_sess2', 'rb', '1')$$);
SELECT dblink_exec('producer', 'ROLLBACK');
SELECT pg_temp.hear(10);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE n = 10
), 0, 'a rolled-back offer sends none');
SELECT is(
    (SELECT count(*)::int FROM dblink('producer', $$SELECT key FROM dq_get('t_sess2', 'rb')$$) AS t (k text)), 0,  -- noqa: AL05
    'and leaves no message'
);
SELECT is((
    SELECT count(*)::int FROM heard
    WHERE channel <> 'dq_wakeup'
), 0, 'only the dq_wakeup channel is used');

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

SELECT dblink_disconnect('producer');
SELECT dblink_disconnect('holder');
SELECT dblink_disconnect('listener');
SELECT dblink_disconnect('waiter');
SELECT * FROM finish();
ROLLBACK;
-- the messages were committed by the other sessions: remove them
SELECT dq_purge('t_sess') + dq_purge('t_sess2') AS removed;
