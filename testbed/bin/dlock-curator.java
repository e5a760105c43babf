// One Curator participant for the ZooKeeper interop tests, driven line by
// line on stdin: `try` answers `acquired` or `held`, `acquire` answers
// `acquired` once granted, `release` answers `released`; a failure answers
// `error <message>`. Run by `dlock-curator`, inside the ZooKeeper container.
//
// Arguments: <connect string> <lock path> mutex|read|write|semaphore [permits]

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

class DlockCurator {
    static InterProcessLock lock;
    static InterProcessSemaphoreV2 semaphore;
    static Lease lease;

    static void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static boolean take(long waitMs) throws Exception {
        if (semaphore != null) {
            lease = waitMs < 0 ? semaphore.acquire() : semaphore.acquire(waitMs, TimeUnit.MILLISECONDS);
            return lease != null;
        }
        if (waitMs < 0) {
            lock.acquire();
            return true;
        }
        return lock.acquire(waitMs, TimeUnit.MILLISECONDS);
    }

    static void run(String command) throws Exception {
        switch (command) {
            case "try" -> say(take(0) ? "acquired" : "held");
            case "acquire" -> say(take(-1) ? "acquired" : "held");
            case "release" -> {
                if (semaphore != null) {
                    semaphore.returnLease(lease);
                    lease = null;
                } else {
                    lock.release();
                }
                say("released");
            }
            default -> say("error unknown command " + command);
        }
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(
            args[0], 10_000, 5_000, new RetryNTimes(3, 200));
        client.start();
        if (!client.blockUntilConnected(15, TimeUnit.SECONDS)) {
            say("error not connected");
            System.exit(1);
        }
        String path = args[1];
        switch (args[2]) {
            case "mutex" -> lock = new InterProcessMutex(client, path);
            case "read" -> lock = new InterProcessReadWriteLock(client, path).readLock();
            case "write" -> lock = new InterProcessReadWriteLock(client, path).writeLock();
            case "semaphore" -> semaphore = new InterProcessSemaphoreV2(client, path, Integer.parseInt(args[3]));
            default -> throw new IllegalArgumentException(args[2]);
        }
        // Curator's locks belong to the thread that took them: every
        // command runs on this one.
        ExecutorService worker = Executors.newSingleThreadExecutor();
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String command = line.trim();
            worker.submit(() -> {
                try {
                    run(command);
                } catch (Exception e) {
                    say("error " + e);
                }
            });
        }
        // Stdin closed: finish what was asked, then leave (our nodes go
        // with the session).
        worker.shutdown();
        worker.awaitTermination(30, TimeUnit.SECONDS);
        client.close();
        System.exit(0);
    }
}
