"""Learning: optimizers and the counters an update keeps, batch layouts, advantages, the PPO update, critics."""
