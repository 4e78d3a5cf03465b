# 示意,非源码
class CodeRubric(Rubric):
    def __init__(self):
        super().__init__()
        self.syntax = SyntaxRubric()      # 赋值即注册为子评分器
        self.tests = TestPassRubric()

    def forward(self, action, observation):
        return 0.3 * self.syntax(action, observation) + 0.7 * self.tests(action, observation)

rubric = CodeRubric()
reward = rubric(action, obs)
for name, r in rubric.named_rubrics():
    print(name, r.last_score)         # "syntax 1.0" / "tests 0.5" —— 可逐项审查
