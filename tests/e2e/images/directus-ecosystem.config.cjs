// A LOOK-ALIKE of directus/directus' ecosystem.config.cjs (@0e19941b): pm2 runs `cli.js start` as the
// app "directus", its instances, mode and restarts set by PM2_* variables (see pm2's
// application-declaration docs); pm2 waits for the process' ready message.
const env = process.env;
module.exports = [{
	name: 'directus',
	script: 'cli.js',
	args: ['start'],
	instances: env.PM2_INSTANCES ?? '1',
	exec_mode: env.PM2_EXEC_MODE ?? 'cluster',
	max_memory_restart: env.PM2_MAX_MEMORY_RESTART,
	min_uptime: env.PM2_MIN_UPTIME,
	listen_timeout: env.PM2_LISTEN_TIMEOUT,
	kill_timeout: env.PM2_KILL_TIMEOUT,
	wait_ready: true,
	max_restarts: env.PM2_MAX_RESTARTS,
	restart_delay: env.PM2_RESTART_DELAY ?? 0,
	autorestart: env.PM2_AUTO_RESTART ?? false,
}];
