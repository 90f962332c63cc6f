"""`RetryBudget`: how many retries a pool may add to the requests it is sent."""

from __future__ import annotations


class RetryBudget:
    """Retries may add at most `ratio` of the requests sent, plus a small reserve."""

    def __init__(self, ratio: float, reserve: float = 10.0) -> None:
        self.ratio = ratio
        self.reserve = reserve
        self.balance = reserve

    def deposit(self) -> None:
        self.balance = min(self.reserve + 100 * self.ratio, self.balance + self.ratio)

    def withdraw(self) -> bool:
        if self.balance >= 1.0:
            self.balance -= 1.0
            return True
        return False
