<?php
// pgdq's classic protocol from PHP: add two delayed jobs, pop each when it
// falls due (a long poll, no busy loop), finish it. Needs php-cli with the
// curl extension and a running `pgdq serve`.
//
//   php examples/classic.php [URL] [TOPIC]     (default http://127.0.0.1:8080 order_close)
//   PGDQ_TOKEN=...  adds "Authorization: Bearer ..." when the server has tokens

declare(strict_types=1);

$url = $argv[1] ?? 'http://127.0.0.1:8080';
$topic = $argv[2] ?? 'order_close';

// Send one command; its answer, or exit with the server's error.
function command(string $url, array $command): array
{
    $headers = ['Content-Type: application/json'];
    if (getenv('PGDQ_TOKEN')) {
        $headers[] = 'Authorization: Bearer ' . getenv('PGDQ_TOKEN');
    }
    $curl = curl_init($url . '/command');
    curl_setopt_array($curl, [
        CURLOPT_POST => true,
        CURLOPT_POSTFIELDS => json_encode($command, JSON_THROW_ON_ERROR),
        CURLOPT_HTTPHEADER => $headers,
        CURLOPT_RETURNTRANSFER => true,
        CURLOPT_TIMEOUT => 90,
    ]);
    $raw = curl_exec($curl);
    if ($raw === false) {
        fwrite(STDERR, 'request failed: ' . curl_error($curl) . "\n");
        exit(1);
    }
    $answer = json_decode($raw, true, 512, JSON_THROW_ON_ERROR);
    if (!$answer['success']) {
        fwrite(STDERR, "{$command['command']} failed: {$answer['error']}\n");
        exit(1);
    }
    return $answer;
}

// Close unpaid orders: order 1 in 2 seconds, order 2 now; each pop leases its job for TTR seconds.
foreach ([[1, 2], [2, 0]] as [$order, $delay]) {
    $id = "order_close:$order";
    $body = json_encode(['order' => $order, 'reason' => 'unpaid']);
    command($url, ['command' => 'add', 'topic' => $topic, 'id' => $id, 'delay' => $delay, 'TTR' => 30, 'body' => $body]);
    echo "added $id, due in {$delay}s\n";
}

for ($done = 0; $done < 2;) {
    $job = command($url, ['command' => 'pop', 'topic' => $topic, 'wait' => 10]);
    if ($job['id'] === null) {
        continue;  // nothing fell due within the wait: ask again
    }
    $order = json_decode($job['value'], true);
    echo "closing order {$order['order']}\n";
    command($url, ['command' => 'finish', 'id' => $job['id']]);
    echo "finished {$job['id']}\n";
    $done++;
}
