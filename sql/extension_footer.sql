-- Extension only: let pg_dump keep the messages (the table is extension-owned).
SELECT pg_catalog.pg_extension_config_dump('dq_messages', '');
SELECT pg_catalog.pg_extension_config_dump('dq_queues', '');
SELECT pg_catalog.pg_extension_config_dump('dq_dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('dq_schedules', '');
